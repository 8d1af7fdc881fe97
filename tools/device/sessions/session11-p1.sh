#!/usr/bin/env bash
# Session 11, probe 1: what bounds the decode mat-vec at 45–51 % of copy. Ceilings of the qmv
# loop (KESTREL_QMV_CEIL: alu = no nibble arithmetic, sub = no −2^23, sb = no scale/bias
# loads) and one register set per round (KESTREL_QMV_PF=0) on the 256 MiB matrix and E2B/E4B
# shapes (kbench, weights read from memory), the lanes × rows sweep on the 256 MiB matrix, and
# E4B decode with PF 0/1.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
export KBENCH_SHAPES="256 MiB,E2B gate|up,E4B gate|up,E4B down,E4B q|k|v,E4B LM head"
for pf in 1 0; do
  for ceil in none alu sub sb; do
    echo "== PF=$pf CEIL=$ceil" | tee -a "$F"
    KESTREL_QMV_PF=$pf KESTREL_QMV_CEIL=$ceil ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "copy roofline|^\| [0-9E]" | tee -a "$F"
  done
done
echo "== sweep 256 MiB" | tee -a "$F"
KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t1 --sweep 2>&1 | grep -E "copy roofline|^\| [0-9E]" | tee -a "$F"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for pf in 1 0 1; do ab_run "$F" e4b KESTREL_QMV_PF=$pf; done
date -u | tee -a "$F"
