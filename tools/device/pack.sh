#!/usr/bin/env bash
# Copies the release binaries a device probe needs into target/carry/, stripped and gzipped
# (the device tool carries at most 64 MiB with the tree): kestrel, and with --tests the
# tests/kernels.rs, tests/fixtures.rs, tests/experts.rs and tests/speculative.rs binaries
# (ktests, kfixtures, kexperts, kspec) and benches/kernels.rs (kbench). Build first: cargo build --release --bins --benches --tests.
# On the device: `. tools/device/env.sh` unpacks them into target/release/.
set -euo pipefail
mkdir -p target/carry
rm -f target/carry/*
exe() { cargo "$@" --no-run --message-format=json 2>/dev/null | python3 -c "
import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('executable') and '/deps/' in m['executable']: print(m['executable'])"; }
pack() { strip -o "target/carry/$2" "$1" && gzip -9 "target/carry/$2"; }
pack target/release/kestrel kestrel
if [ "${1:-}" = --tests ]; then
  pack "$(exe test --release --test kernels)" ktests
  pack "$(exe test --release --test fixtures)" kfixtures
  pack "$(exe bench --bench kernels)" kbench
  pack "$(exe test --release --test experts)" kexperts
  pack "$(exe test --release --test speculative)" kspec
fi
ls -la target/carry
