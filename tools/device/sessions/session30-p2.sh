#!/usr/bin/env bash
# Session 30, p2 (E2B and E4B; session30-p1.sh has the 26B): the fused-norm kernel test on the
# H200 (plain and hoisted forms bitwise equal, both against the reference), then decode A/B, one
# process each, alternating: attention_short's tree sum (the default) / its group-0 sum / round
# 0's weight loads hoisted above the fused-norm prologue (KESTREL_PRO_HOIST=1, session 30) / the
# two together on E2B, on E4B the hoist with every residual norm fused (KESTREL_FUSE_NORMS=all:
# fusion lost at 2560 for the prologue's latency, which the hoist hides) (-p 16 -n 128), two
# rounds; then the fixtures on the H200 with every unmeasured knob on. ≈ 7 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
echo "== ktests qmv_rows_are_bitwise_equal_across_token_tiles" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests qmv_rows_are_bitwise --nocapture 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== ktests every_kernel KESTREL_KERNELS=norm" | tee -a "$F"
KESTREL_KERNELS=norm KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "FAIL|test result|panicked|cases" | tail -8 | tee -a "$F"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_PRO_HOIST=0
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=group0 KESTREL_PRO_HOIST=0
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_PRO_HOIST=1
    if [ $a = e2b ]; then ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=group0 KESTREL_PRO_HOIST=1
    else ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_PRO_HOIST=1 KESTREL_FUSE_NORMS=all; fi
  done
  rm -rf /tmp/$a
done
echo "== kfixtures KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=1 KESTREL_PRO_HOIST=1 ($(date -u +%T))" | tee -a "$F"
KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=1 KESTREL_PRO_HOIST=1 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
