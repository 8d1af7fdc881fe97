#!/usr/bin/env bash
# Builds the tree at HEAD with an experiment patch applied (in a scratch worktree) and adds its
# kestrel and tests/kernels.rs binaries to target/carry as kestrel_SUFFIX and ktests_SUFFIX,
# stripped and gzipped, beside what pack.sh put there (run pack.sh first: it empties the
# folder). Usage: bash tools/device/pack-patch.sh tools/experiments/NAME.patch SUFFIX
set -euo pipefail
patch=$(realpath "$1"); suffix=$2
wt=$(mktemp -d /tmp/kestrel-patch.XXXXXX)
trap 'git worktree remove --force "$wt"' EXIT
git worktree add -q --detach "$wt" HEAD
(cd "$wt" && git apply "$patch" && cargo build --release --bin kestrel)
tests=$(cd "$wt" && cargo test --release --test kernels --no-run --message-format=json 2>/dev/null | python3 -c "
import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('executable') and '/deps/' in m['executable']: print(m['executable'])")
mkdir -p target/carry
strip -o "target/carry/kestrel_$suffix" "$wt/target/release/kestrel" && gzip -9f "target/carry/kestrel_$suffix"
strip -o "target/carry/ktests_$suffix" "$tests" && gzip -9f "target/carry/ktests_$suffix"
ls -la target/carry
