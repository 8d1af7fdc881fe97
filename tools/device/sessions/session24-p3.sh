#!/usr/bin/env bash
# Session 24, third call: where a mid-size decode mat-vec's time goes, with the clock held up
# (p2): kbench's decode qmv rows (E2B and E4B q|k|v, down, gate|up; µs from L2 and from memory)
# with parts stripped by KESTREL_QMV_CEIL (wrong output: alu = the dot's arithmetic, x = x's
# loads, sb = scale/bias loads, red = the lane reduction, skel = all but launch, reduction and
# store), then the lanes × rows sweep on the q|k|v and down shapes. ≈ 3 min warm.
# Carry target/carry and .gl. Build with tools/experiments/qmv-ceilings-session24.patch applied
# (the KESTREL_QMV_CEIL knob is not in the tree).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3-qmv-ceilings.txt"
date -u | tee "$F"
S="E2B q|k|v,E2B gate|up,E2B down,E4B q|k|v,E4B gate|up,E4B down"
for c in none alu alu,x alu,x,sb alu,x,sb,red skel; do
  echo "== KESTREL_QMV_CEIL=$c ($(date -u +%T))" | tee -a "$F"
  if [ $c = none ]; then unset KESTREL_QMV_CEIL; else export KESTREL_QMV_CEIL=$c; fi
  KBENCH_SHAPES="$S" timeout 120 ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|error" | tee -a "$F"
done
unset KESTREL_QMV_CEIL
echo "== sweep ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="E2B q|k|v,E4B q|k|v,E4B down" timeout 200 ./target/release/kbench qmv_q4_t1 --sweep 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|error" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
