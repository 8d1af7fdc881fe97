#!/usr/bin/env bash
# Session 22, third call: the router's top-k inside the routed experts' GeGLU mat-vec
# (moe_route.wgsl, WgpuOptions::moe_route, KESTREL_MOE_ROUTE=0 the A/B). First its checks on
# this GPU: the kernel tests of qmv_moe_glu (the route form bitwise router_topk then the plain
# form: y, picks, weights); tests/experts.rs whole (every tiny MoE fixture resident — route form
# — and streamed — router_topk — must give bitwise the same logits, and match transformers);
# the fixtures end to end. Then the 26B decode A/B at the table's context (`kestrel bench -p
# 512 -n 128`, route 0, 1, 0, 1): tg128, the step line and the routed rows of the profile.
# ≈ 5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4-moe-route.txt"
date -u | tee "$F"
echo "== tests/kernels.rs moe_glu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests moe_glu --nocapture 2>&1 | grep -E "OK|test result|panicked|differs" | tee -a "$F"
echo "== tests/experts.rs" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 240 ./target/release/kexperts 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
date -u | tee -a "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for s in 0 1 0 1; do
  ab_bench "$F" 26b-a4b "-p 512 -n 128" "tg128|decode step:|^\| (qmv_moe|router|moe_norm)" KESTREL_MOE_ROUTE=$s
done
date -u | tee -a "$F"
