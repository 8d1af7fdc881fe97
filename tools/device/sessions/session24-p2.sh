#!/usr/bin/env bash
# Session 24, second call: p1's tables again with the harness's clock burst before each timed
# pass (p1's clock log showed kbench's small dispatches timed at 585-1275 MHz): stream_layout in
# two processes, the E4B and E2B decode mat-vec rows of the qmv table, the latency table's norm, attention and copy rows; the
# clocks logged every 20 ms (p2-clocks.csv). ≈ 4 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2-layout-clocked.txt"
date -u | tee "$F"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader -lms 20 > "$OUT/p2-clocks.csv" 2>&1 &
MON=$!
for run in 1 2; do
  echo "== kbench stream_layout, process $run ($(date -u +%T))" | tee -a "$F"
  timeout 300 ./target/release/kbench stream_layout 2>&1 | grep -E "^copy|^\| [0-9E]|error" | tee -a "$F"
done
echo "== kbench qmv, E4B and E2B shapes ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="E4B q|k|v,E4B gate|up,E4B down,E2B q|k|v,E2B gate|up,E2B down" timeout 200 ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|^copy" | tee -a "$F"
for k in rmsnorm attention_ copy; do
  echo "== kbench latency rows of $k ($(date -u +%T))" | tee -a "$F"
  KBENCH_SHAPES=none timeout 200 ./target/release/kbench $k 2>&1 | sed -n '/decode kernel (dependent chain)/,/^$/p' | tee -a "$F"
done
echo "== end ($(date -u +%T))" | tee -a "$F"
kill $MON
