#!/usr/bin/env bash
# Session 16, call 5: the residual norms reading a split-k mat-mat's partials themselves
# (rmsnorm.wgsl's chunk form, Builder::split_partials_of) instead of a qmm_sum dispatch writing
# x first; KESTREL_NORM_SPLITS=0 keeps qmm_sum. The fixtures end to end with both settings, then
# pp512 with KESTREL_NORM_SPLITS 0 / 1 / 0 / 1 on E4B and E2B. ≈ 3.5 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl. The change lost on E4B and was reverted: apply
# tools/experiments/norm-split-partials.patch (it applies to c96c30a's kernels) to run this again.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-splits.txt"
date -u | tee "$F"
for v in 1 0; do
  echo "== tests/fixtures.rs wgpu, KESTREL_NORM_SPLITS=$v" | tee -a "$F"
  KESTREL_NORM_SPLITS=$v KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
done
for a in e4b e2b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 0 1 0 1; do
    ab_bench "$F" $a "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| (qmm_sum|rmsnorm)" KESTREL_NORM_SPLITS=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
