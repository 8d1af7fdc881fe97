#!/usr/bin/env bash
# Session 35, p4, as run: BENCHMARKS.md's table with route_norm on by default (a MoE layer's
# post-attention norm, router projection and top-k in one decode / verify dispatch; the binary
# was b10a957's tree with WgpuOptions::route_norm still true), the 26B's A/B in the same call
# (KESTREL_ROUTE_NORM=0 / defaults / =0 after the table's own run, decode only, one process
# each) and, on this GPU, the route_norm and router kernel tests, the expert tests and the wgpu
# speculative tests. KTESTS=0 (session 34's table ran the other kernel tests with these
# kernels). Since b10a957 route_norm is off by default: to repeat this call, export
# KESTREL_ROUTE_NORM=1 and swap the A/B's settings. ≈ 8 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
route_ab() {
  [ "$2" = 26b-a4b ] || return 0
  for s in KESTREL_ROUTE_NORM=0 KESTREL_DEFAULTS=1 KESTREL_ROUTE_NORM=0; do
    ab_bench "$1" "$2" "-p 16 -n 128" "tg128|decode step:|^\| (route_norm|router|matmul_q8_t1|rmsnorm \|)" $s
  done
}
KTESTS=0 final_checks "$F"
echo "== ktests route_norm, router ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests route_norm --nocapture 2>&1 | grep -E "NMSE|test result|panicked" | grep -vE "out[234]? NMSE" | tail -14 | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests router 2>&1 | grep -E "test result|panicked|FAIL" | tee -a "$F"
echo "== kexperts, kspec wgpu ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kexperts 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kspec wgpu 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$F"
for arch in 26b-a4b e4b e2b; do
  TABLE_AB=route_ab table_row "$F" $arch
done
echo "== end ($(date -u +%T))" | tee -a "$F"
