#!/usr/bin/env bash
# Session 24, first call: does where a dispatch's bytes live set the mid-size read floor? kbench's
# stream_layout table (stream_read and the decode mat-vecs, their buffers as separate copies,
# packed in one arena cycled over 512 MiB or >= 2 GiB, or one copy) in two processes, with the
# GPU's clocks logged every 50 ms (p1-clocks.csv), then E4B decode (-p 16 -n 128) under the
# same log. ≈ 4 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-layout.txt"
date -u | tee "$F"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee -a "$F"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu --format=csv,noheader -lms 50 > "$OUT/p1-clocks.csv" 2>&1 &
MON=$!
for run in 1 2; do
  echo "== kbench stream_layout, process $run ($(date -u +%T))" | tee -a "$F"
  timeout 300 ./target/release/kbench stream_layout 2>&1 | grep -E "^copy|^\| |error" | tee -a "$F"
done
echo "== e4b synth ($(date -u +%T))" | tee -a "$F"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
echo "== e4b bench ($(date -u +%T))" | tee -a "$F"
ab_bench "$F" e4b "-p 16 -n 128" "tg128|decode step:"
echo "== end ($(date -u +%T))" | tee -a "$F"
kill $MON
