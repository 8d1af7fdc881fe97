#!/usr/bin/env bash
# Session 15 #2's ceilings (PERF_NOTES.md): why the exact-weight tile loop lost at 128 tokens
# (TB = 2) and won at 64. kbench's qmm_coop 128 × 128 rows (every shape, every k split), twice,
# from four builds: base (qmm_coop_core.wgsl, split weights: 2d51f3b), ex (the dense tile on
# qmm_coop_exact_core.wgsl), c1 (ex without the Σx sums: no partial sums, shuffles or xs
# writes; wrong output), c2 (c1 without the bias step's loads and products). Builds from
# tools/experiments/qmm-coop-exact-ceilings.patch, carried as target/carry/kbench_*.gz. ≈ 2 min.
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-coop-exact-ceilings.txt"
date -u | tee "$F"
for i in 1 2; do
  for b in kbench_base kbench_ex kbench_c1 kbench_c2; do
    echo "== $b" | tee -a "$F"
    timeout 120 ./target/release/$b qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
  done
done
date -u | tee -a "$F"
