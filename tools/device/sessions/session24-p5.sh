#!/usr/bin/env bash
# Session 24, fifth call: the general mat-vec rule with at most 32 lanes per row
# (KESTREL_QMV_MAX_LANES=32: one subgroup per row, no cross-warp reduction; the final call's
# E4B q|k|v at 32 × 2 took tg128 208.4 -> 218.3) on all three models, alternating with the rule
# (-p 16 -n 128), after the fixtures and the expert test with it on. ≈ 5 min warm. Carry
# target/carry and .gl. Built with the knob in the tree (commit after session24-final.sh).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5-max-lanes.txt"
date -u | tee "$F"
echo "== fixtures, experts, KESTREL_QMV_MAX_LANES=32" | tee -a "$F"
KESTREL_QMV_MAX_LANES=32 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|differ" | tee -a "$F"
KESTREL_QMV_MAX_LANES=32 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kexperts 2>&1 | grep -E "test result|panicked" | tee -a "$F"
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 128 32 128 32; do ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:|^\| qmv_" KESTREL_QMV_MAX_LANES=$s; done
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
