#!/usr/bin/env bash
# Session 17, third call: the chunk norms' rows form (rmsnorm_rows.wgsl, KESTREL_NORM_ROWS,
# default 128 threads per row). The rmsnorm kernel cases (every form), the fixtures end to end
# with 128 and 64 threads per row, kbench's chunk residual norms in both forms, then pp512 with
# KESTREL_NORM_ROWS 0 / 128 / 0 / 128 on E2B, E4B and 26B, and 64 / 256 once each on E4B.
# Also the fixtures with KESTREL_GELU_SPLITS=1, unfiltered (p2's showed no line). ≈ 7 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-rows.txt"
date -u | tee "$F"
echo "== tests/kernels.rs, the rmsnorm cases" | tee -a "$F"
KESTREL_KERNELS=rmsnorm KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^rmsnorm[_a-z0-9]* +[0-9]|FAIL|test result|panicked" | tee -a "$F"
for v in KESTREL_NORM_ROWS=128 KESTREL_NORM_ROWS=64; do
  echo "== tests/fixtures.rs wgpu, $v" | tee -a "$F"
  env $v KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
done
echo "== tests/fixtures.rs wgpu, KESTREL_GELU_SPLITS=1 (p2's grep showed nothing: the whole tail)" | tee -a "$F"
KESTREL_GELU_SPLITS=1 KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kfixtures wgpu 2>&1 | tail -25 | tee -a "$F"; echo "exit ${PIPESTATUS[0]}" | tee -a "$F"
echo "== kbench chunk residual norms" | tee -a "$F"
timeout 120 ./target/release/kbench rmsnorm 2>&1 | grep -E "^\| 512 × " | tee -a "$F"
AB_VALUES="0 128 0 128" pp_ab "$F" KESTREL_NORM_ROWS "^\| pp512 |GPU time of one 512|^\| (rmsnorm|qmm_sum)"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for s in 64 256; do
  ab_bench "$F" e4b "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| rmsnorm" KESTREL_NORM_ROWS=$s
done
date -u | tee -a "$F"
