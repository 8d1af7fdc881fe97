#!/usr/bin/env bash
# Session 30, last call: the kernel tests (with the ignored tensor-core ones), the fixtures and
# the 256 MiB mat-vec at the session's defaults (the knobs p1 and p2 adopted), then BENCHMARKS.md's
# table: `kestrel bench -p 512 -n 128` and the transformers peer (eager) per model. ≈ 7 min
# warm. Carry target/carry (--tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
final_checks "$F"
for arch in 26b-a4b e4b e2b; do
  table_row "$F" $arch
done
echo "== end ($(date -u +%T))" | tee -a "$F"
