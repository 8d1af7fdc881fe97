#!/usr/bin/env bash
# Packs release binaries for the machine with the GPU into target/carry/, stripped and gzipped
# (env.sh unpacks them there into target/release/). Build first, on the build machine:
#
#   cargo build --release --bins --benches --tests
#   bash tools/device/pack.sh --tests
#
# kestrel always; with --tests also the test and bench binaries the scripts run: ktests
# (tests/kernels.rs), kfixtures (tests/fixtures.rs), kexperts (tests/experts.rs), kspec
# (tests/speculative.rs) and kbench (benches/kernels.rs).
#
# A second build for an A/B of two builds (`ab.sh e4b @kestrel_base ""`): build it in its own
# checkout, then pack it beside the first under a suffix, which keeps what target/carry holds:
#
#   git worktree add /tmp/base BASE_COMMIT && (cd /tmp/base && cargo build --release)
#   bash tools/device/pack.sh --from /tmp/base --suffix base      # target/carry/kestrel_base.gz
#
# An experiment kept only in git (PERF_NOTES.md, the code column) is built the same way, with its
# patch applied in that checkout first.
set -euo pipefail
tests=0 from=. suffix=
while [ $# -gt 0 ]; do
  case $1 in
    --tests) tests=1; shift ;;
    --from) from=$2; shift 2 ;;
    --suffix) suffix=_$2; shift 2 ;;
    *) echo "usage: pack.sh [--tests] [--from CHECKOUT] [--suffix NAME]" >&2; exit 2 ;;
  esac
done
carry=$PWD/target/carry
mkdir -p "$carry"
[ -n "$suffix" ] || rm -f "$carry"/*
# The path of a test or bench binary cargo built (the newest of its name under target/release/deps).
exe() { (cd "$from" && cargo "$@" --no-run --message-format=json 2> /dev/null) | python3 -c "
import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('executable') and '/deps/' in m['executable']: print(m['executable'])"; }
pack() { strip -o "$carry/$2$suffix" "$1" && gzip -9f "$carry/$2$suffix"; }
pack "$from/target/release/kestrel" kestrel
if [ $tests = 1 ]; then
  pack "$(exe test --release --test kernels)" ktests
  pack "$(exe test --release --test fixtures)" kfixtures
  pack "$(exe test --release --test experts)" kexperts
  pack "$(exe test --release --test speculative)" kspec
  pack "$(exe bench --bench kernels)" kbench
fi
ls -la "$carry"
