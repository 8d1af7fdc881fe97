#!/usr/bin/env bash
# Session 9, probe 5: what bounds qmm_coop's 128 × 128 tile — kbench's prefill rows with
# ceilings from tools/experiments/qmm-coop-ceilings.patch (KESTREL_EXP_COOP: two = no x_hi·w_lo
# MMA, one = only x_hi·w_hi, no_stage = no dequantisation or split, no_mma = staging only;
# wrong output, true time). Carry target/carry (built with the patch applied) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5.txt"
date -u | tee "$F"
for v in default two one no_stage no_mma; do
  echo "== KESTREL_EXP_COOP=$v" | tee -a "$F"
  KESTREL_EXP_COOP=$v ./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E4B (gate|down|q\|)" | tee -a "$F"
done
date -u | tee -a "$F"
