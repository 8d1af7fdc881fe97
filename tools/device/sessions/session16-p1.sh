#!/usr/bin/env bash
# Planned first call of session 16 (PERF_NOTES.md, session 15, next steps (1)): group_sum's wide
# form (KESTREL_GROUP_SUM=wide: gs / 4 threads per group, neighbouring vec4 loads, summed in
# workgroup memory), built in session 15 after its device time was spent. group_sum's kernel
# cases (both forms) and the tensor-core tests, the fixtures with the wide form, kbench's
# group_sum table, then pp512 with KESTREL_GROUP_SUM narrow / wide / narrow / wide on E2B, E4B
# and 26B ("narrow" is no setting: the default). ≈ 5 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/group-sum-wide.txt"
date -u | tee "$F"
KESTREL_KERNELS=group_sum KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^group_sum|test result|FAIL|panicked" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests coop --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_GROUP_SUM=wide" | tee -a "$F"
KESTREL_GROUP_SUM=wide KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
echo "== kbench group_sum" | tee -a "$F"
timeout 120 ./target/release/kbench group_sum 2>&1 | grep -E "^\| 512 " | tee -a "$F"
AB_VALUES="narrow wide narrow wide" pp_ab "$F" KESTREL_GROUP_SUM "^\| pp512 |GPU time of one 512|^\| group_sum"
date -u | tee -a "$F"
