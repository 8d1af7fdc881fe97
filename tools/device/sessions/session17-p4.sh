#!/usr/bin/env bash
# Session 17, fourth call: the chunk residual norms over split-k partials in the rows form
# (KESTREL_NORM_SPLITS=1, off until measured: the qmm_sum before each goes). The rmsnorm kernel
# cases and the bitwise test against qmm_sum then the norm, the fixtures end to end with it on
# (and whether their tiny models split k at all: the profile's parts rows), then pp512 on E4B
# with KESTREL_NORM_SPLITS 0 / 1 / 0 / 1. ≈ 2.5 min. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-splits.txt"
date -u | tee "$F"
KESTREL_KERNELS=rmsnorm KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^rmsnorm[_a-z0-9]* +[0-9]|FAIL|test result|panicked" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/ktests rmsnorm 2>&1 | grep -E "^test |FAIL|panicked" | tee -a "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_NORM_SPLITS=1" | tee -a "$F"
KESTREL_NORM_SPLITS=1 KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/kfixtures wgpu 2>&1 | tail -4 | tee -a "$F"
for m in tiny-e4b tiny-e2b; do
  echo "== $m, KESTREL_NORM_SPLITS=1: the chunk's split sums and norms" | tee -a "$F"
  KESTREL_NORM_SPLITS=1 timeout 60 ./target/release/kestrel bench --model tests/fixtures/$m/mlx-4bit -p 64 -n 4 2>&1 | grep -E "^\| (qmm_sum|rmsnorm_rows)" | head -4 | tee -a "$F"
done
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for s in 0 1 0 1; do
  ab_bench "$F" e4b "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| (rmsnorm_rows|qmm_sum)" KESTREL_NORM_SPLITS=$s
done
date -u | tee -a "$F"
