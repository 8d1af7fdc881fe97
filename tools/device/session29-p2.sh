#!/usr/bin/env bash
# Session 29, p2 (E2B and E4B; p1 has the 26B): decode A/B, one process each, alternating
# attention_short's tree sum (the default) / its group-0 sum / the tree at 512 threads
# (-p 16 -n 128), two rounds; then the fixtures on the H200 with both session 28–29 knobs on
# (KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=1). ≈ 5 min warm. Carry target/carry
# (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=group0
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_SUM=tree KESTREL_ATTN_SHORT_WG=512
  done
  rm -rf /tmp/$a
done
echo "== kfixtures KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=1 ($(date -u +%T))" | tee -a "$F"
KESTREL_ATTN_SHORT_SUM=group0 KESTREL_ROUTER_ONE=1 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
