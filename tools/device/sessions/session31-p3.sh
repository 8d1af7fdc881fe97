#!/usr/bin/env bash
# Session 31, p3 (not run in session 31: the device was refused after p2): the decode norms'
# threads split from the MoE close's. p1 found rmsnorm at 512 threads faster in the step on E4B
# (+2 %), E2B even, and the 26B slower (−1.2 %); p2's timestamped profile put the 26B's loss in
# moe_norm, which took rmsnorm's threads (11.3 → 12.5 µs a dispatch). Now rmsnorm defaults to
# 512 and moe_norm keeps 1024 (kernels::RMSNORM_WG, MOE_NORM_WG). Decode A/B (env.sh's tg_ab),
# one process each, alternating KESTREL_RMSNORM_WG=1024 (session 30's default), =256 (session
# 18's before it; never run beside 512) and the defaults, two rounds on the 26B and E4B; then
# the norm and moe_norm kernel tests and the fixtures at the defaults. ≈ 5 min warm. Carry
# target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
P="tg128|decode step:|^\| (rmsnorm|moe_norm) "
tg_ab "$F" "26b-a4b e4b" "$P" KESTREL_RMSNORM_WG=1024 KESTREL_RMSNORM_WG=256 KESTREL_DEFAULTS=1
echo "== ktests every_kernel (rmsnorm) and moe_norm at the defaults" | tee -a "$F"
KESTREL_KERNELS=rmsnorm KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests every_kernel moe_norm --nocapture 2>&1 | grep -E "FAIL|test result|panicked|moe_norm n" | tee -a "$F"
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
