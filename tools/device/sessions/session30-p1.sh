#!/usr/bin/env bash
# Session 30, p1 (the 26B; session30-p2.sh has E2B and E4B; session 29's p1 with its last A/B form
# replaced: router_one with every residual norm fused (KESTREL_FUSE_NORMS=all) and round 0 hoisted
# above the prologue (KESTREL_PRO_HOIST=1, session 30: fusion lost at 2816 for the prologue's
# latency, which the hoist hides). Router_one and the hoist were removed after this call: apply
# tools/experiments/router-one.patch and qmv-pro-hoist.patch to run it again. Two unmeasured knobs: attention_short's
# value-group sums by group 0 (KESTREL_ATTN_SHORT_SUM=group0, session 28) and the 8-bit MoE
# router's mat-vec and top-k in one workgroup per token (KESTREL_ROUTER_ONE=1, router_one.wgsl,
# session 29). (1) on the H200: the router kernel tests (router_one against an f64 reference and
# the two dispatches it replaces) and the split-attention test in both sum forms; the MoE
# fixtures with router_one (kexperts router_one: ids against transformers, logits against the two
# dispatches); (2) kbench: attention_short rows in both sum forms; the router rows (matmul_q8_t1,
# router_topk, router_one at 256/512/1024 threads × 1/2/4 groups in flight, weights from memory)
# and the 26B router row of the decode table (matmul_q8_t1 beside qmv's 4-bit pick); (3) 26B
# decode A/B, one process each, alternating: default / group0 / router_one / both (-p 16 -n 128),
# two rounds. ≈ 6 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== ktests router" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests router --nocapture 2>&1 | grep -E "router_one|test result|panicked|FAILED" | tail -20 | tee -a "$F"
for s in tree group0; do
  echo "== ktests split_attention KESTREL_ATTN_SHORT_SUM=$s" | tee -a "$F"
  KESTREL_ATTN_SHORT_SUM=$s KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests split_attention --nocapture 2>&1 | grep -E "short|mixed|test result|panicked|FAILED" | tail -30 | tee -a "$F"
done
echo "== kexperts router_one ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kexperts router_one --nocapture 2>&1 | grep -E "tiny|test result|panicked|FAILED" | tee -a "$F"
for s in tree group0 tree group0; do
  echo "== kbench attention_short KESTREL_ATTN_SHORT_SUM=$s ($(date -u +%T))" | tee -a "$F"
  KESTREL_ATTN_SHORT_SUM=$s KBENCH_SHAPES=none timeout 120 ./target/release/kbench attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
done
echo "== kbench router rows ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES=none timeout 120 ./target/release/kbench router 2>&1 | grep -E "^\| router" | tee -a "$F"
echo "== kbench 26B router, decode table ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="26B router" timeout 120 ./target/release/kbench _t1 2>&1 | grep -E "^\| 26B router" | tee -a "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for r in 1 2; do
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "tg128|decode step:|^\| (router|matmul_q8)" KESTREL_ATTN_SHORT_SUM=tree KESTREL_ROUTER_ONE=0
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=0
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "tg128|decode step:|^\| (router|matmul_q8)" KESTREL_ATTN_SHORT_SUM=tree KESTREL_ROUTER_ONE=1
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_ROUTER_ONE=1 KESTREL_FUSE_NORMS=all KESTREL_PRO_HOIST=1
done
rm -rf /tmp/26b-a4b
echo "== end ($(date -u +%T))" | tee -a "$F"
