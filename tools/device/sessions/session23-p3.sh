#!/usr/bin/env bash
# Session 23, third call: the MoE router in one dispatch for decode and verify steps
# (router_fused.wgsl, WgpuOptions::router_fused, KESTREL_ROUTER_FUSED). Its kernel test and the
# router_topk cases (router_pick.wgsl now shared by both), tests/experts.rs (resident and streamed
# logits bitwise, the overlap test) and the fixtures end to end on this GPU; then the 26B's decode
# A/B at the table's context (`kestrel bench -p 512 -n 128`), 0 / 1 twice: tg128, the step line
# and the router rows of the per-dispatch profile. ≈ 5 min. Carry target/carry (pack.sh --tests)
# and .gl. The kernel and its wiring were removed after this call (lost: 26B tg128 253.5 → 219.5);
# `git apply tools/experiments/router-fused.patch` restores them for a rerun.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3-router-fused.txt"
date -u | tee "$F"
echo "== tests/kernels.rs router_fused, router cases" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests router 2>&1 | grep -E "^test |test result|panicked|picks|NMSE" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 KESTREL_KERNELS=router timeout 120 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^router|test result|panicked" | tee -a "$F"
echo "== tests/experts.rs" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kexperts 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
date -u | tee -a "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
P="tg128|decode step:|^\| [1-5] \||^\| (router|matmul_q8|rmsnorm|qmv_moe_glu)"
for s in 0 1 0 1; do
  ab_bench "$F" 26b-a4b "-p 512 -n 128" "$P" KESTREL_ROUTER_FUSED=$s
done
date -u | tee -a "$F"
