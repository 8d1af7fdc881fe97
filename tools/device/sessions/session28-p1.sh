#!/usr/bin/env bash
# Session 28, p1: attention_short's value groups summed by group 0 after one barrier
# (KESTREL_ATTN_SHORT_SUM=group0; session 27 #3 measured it as a one-change build: 0.1–0.5 µs
# faster in kbench, E2B 380.9 against 378.8 in one run each) against the halving tree (the
# default), in one binary. (1) the split-attention kernel test in both forms on the H200;
# (2) kbench's attention_short rows in both forms; (3) decode A/B, one process each, alternating
# tree / group0 / tree at 512 threads (E2B, E4B) on E2B, E4B and the 26B (-p 16 -n 128), two
# rounds; (4) the fixtures on the H200 in the group0 form; between (2) and (3), kbench's 26B router row. ≈ 7 min warm. Carry target/carry
# (--tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
for s in tree group0; do
  echo "== ktests split_attention KESTREL_ATTN_SHORT_SUM=$s" | tee -a "$F"
  KESTREL_ATTN_SHORT_SUM=$s KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests split_attention --nocapture 2>&1 | grep -E "short|mixed|test result|panicked|FAILED" | tail -30 | tee -a "$F"
done
for s in tree group0 tree group0; do
  echo "== kbench attention_short KESTREL_ATTN_SHORT_SUM=$s ($(date -u +%T))" | tee -a "$F"
  KESTREL_ATTN_SHORT_SUM=$s KBENCH_SHAPES=none timeout 120 ./target/release/kbench attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
done
# The 26B router's mat-vec (8-bit, the generic matmul_q8_t1) beside the 4-bit kernels of its
# shape (qmv's pick, matmul_q4_t1): whether an 8-bit qmv is worth building (session 28).
echo "== kbench 26B router ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="26B router" timeout 120 ./target/release/kbench _t1 2>&1 | grep -E "^\| 26B router" | tee -a "$F"
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=group0
    [ $a != 26b-a4b ] && ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_ATTN_SHORT_WG=512
  done
  rm -rf /tmp/$a
done
echo "== kfixtures KESTREL_ATTN_SHORT_SUM=group0 ($(date -u +%T))" | tee -a "$F"
KESTREL_ATTN_SHORT_SUM=group0 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
