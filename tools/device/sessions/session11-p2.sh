#!/usr/bin/env bash
# Session 11, probe 2: ceilings of two ways to cut the mat-vec's per-value work — the 32-value
# dot by 24 packed 4×8-bit integer dot products (KESTREL_QMV_CEIL=dp4a: x's bits stand in for
# the split-integer x, wrong output) and scale and bias from one word (sb1) — beside the
# default; then E4B decode at a 512-token context with 4 or 8 keys in flight in attention_split.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
export KBENCH_SHAPES="256 MiB,E2B gate|up,E4B gate|up,E4B down,E4B q|k|v,E4B LM head"
for ceil in none dp4a sb1 none; do
  echo "== CEIL=$ceil" | tee -a "$F"
  KESTREL_QMV_CEIL=$ceil ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "copy roofline|^\| [0-9E]" | tee -a "$F"
done
unset KBENCH_SHAPES
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for g in 4 8 4; do
  echo "== e4b -p 512 KESTREL_ATTN_G=$g" | tee -a "$F"
  KESTREL_ATTN_G=$g ./target/release/kestrel bench --model /tmp/e4b -p 512 -n 128 2>&1 | grep -E "tg128|decode step:|^\| attention_(split|combine)" | tee -a "$F"
done
date -u | tee -a "$F"
