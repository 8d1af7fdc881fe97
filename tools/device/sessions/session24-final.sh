#!/usr/bin/env bash
# Session 24, last call: the checks at the session's last code commit (kernel tests with the
# tensor-core ones, fixtures, the 256 MiB mat-vec), kbench's stream table and the E2B/E4B decode
# mat-vec rows at the held clock (the curve tools/perf/stream_floor.py interpolates), and the
# E4B q|k|v tile of p3's sweep end to end (KESTREL_QMV_TILES 32 lanes × 2 rows against the rule's
# 64 × 4; -p 16 -n 128, alternating). ≈ 4 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
final_checks "$F"
echo "== kbench stream_read ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES=none timeout 300 ./target/release/kbench stream_read 2>&1 | grep -E "^copy|^\| [0-9E]|error" | tee -a "$F"
echo "== kbench qmv, E2B and E4B shapes ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="E2B,E4B" timeout 300 ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|^copy" | tee -a "$F"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
T="3072x2560=32x2,2048x2560=32x2"
for s in default tiles default tiles; do
  if [ $s = tiles ]; then ab_bench "$F" e4b "-p 16 -n 128" "tg128|decode step:|^\| qmv_q4_t1_l(64|32)" KESTREL_QMV_TILES=$T
  else ab_bench "$F" e4b "-p 16 -n 128" "tg128|decode step:|^\| qmv_q4_t1_l(64|32)" KESTREL_QMV_TILES=; fi
done
echo "== end ($(date -u +%T))" | tee -a "$F"
