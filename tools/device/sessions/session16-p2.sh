#!/usr/bin/env bash
# Session 16, call 2: x's group sums written by the chunk norms that write x (rmsnorm.wgsl's
# SUMS form, Builder::norm_sums) instead of a group_sum dispatch per tensor-core mat-mat input
# (KESTREL_NORM_SUMS=0 goes back). The kernel tests with the ignored tensor-core ones, the
# fixtures end to end (both settings: only a device with tensor cores runs the new path), kbench's
# chunk-norm and group_sum tables, then pp512 with KESTREL_NORM_SUMS 0 / 1 / 0 / 1 on E2B, E4B and
# 26B. ≈ 6 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-sums.txt"
date -u | tee "$F"
echo "== tests/kernels.rs (incl. the ignored tensor-core tests)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
for v in 1 0; do
  echo "== tests/fixtures.rs wgpu, KESTREL_NORM_SUMS=$v" | tee -a "$F"
  KESTREL_NORM_SUMS=$v KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
done
echo "== kbench group_sum, rmsnorm" | tee -a "$F"
timeout 120 ./target/release/kbench group_sum 2>&1 | grep -E "^\| 512 " | tee -a "$F"
timeout 120 ./target/release/kbench rmsnorm 2>&1 | grep -E "^\| 512 " | tee -a "$F"
pp_ab "$F" KESTREL_NORM_SUMS "^\| pp512 |GPU time of one 512|^\| (group_sum|rmsnorm)"
date -u | tee -a "$F"
