#!/usr/bin/env bash
# Session 27, last call: the fixtures and the 256 MiB mat-vec at the session's default
# (23b1d49's kernels: p1's and p2's attention_short changes lost and were reverted; the kernel tests
# at 23b1d49 ran on the H200 in session 26's p2), then
# BENCHMARKS.md's table: `kestrel bench -p 512 -n 128` and the transformers peer (eager) per
# model. ≈ 5 min warm. Carry target/carry (--tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
KTESTS=0 final_checks "$F"
for arch in 26b-a4b e4b e2b; do
  table_row "$F" $arch
done
echo "== end ($(date -u +%T))" | tee -a "$F"
