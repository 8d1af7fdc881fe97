#!/usr/bin/env bash
# Session 16, call 3: group sums written by x's producers — the chunk norms (now subgroup sums
# instead of p2's workgroup-memory walk), the GeGLU mat-mat's epilogue (the down projection's
# x) and the PLE gate's gelu_mul (the PLE projection's x) — instead of group_sum dispatches;
# KESTREL_NORM_SUMS=0 turns all three off. The kernel tests with the ignored tensor-core ones
# (qmm_coop_glu's new ysum output), the fixtures end to end with both settings, kbench's
# chunk-norm rows, then pp512 with KESTREL_NORM_SUMS 0 / 1 / 0 / 1 on E2B, E4B and 26B.
# ≈ 6 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/producer-sums.txt"
date -u | tee "$F"
echo "== tests/kernels.rs (incl. the ignored tensor-core tests)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
for v in 1 0; do
  echo "== tests/fixtures.rs wgpu, KESTREL_NORM_SUMS=$v" | tee -a "$F"
  KESTREL_NORM_SUMS=$v KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
done
echo "== kbench rmsnorm" | tee -a "$F"
timeout 120 ./target/release/kbench rmsnorm 2>&1 | grep -E "^\| 512 " | tee -a "$F"
pp_ab "$F" KESTREL_NORM_SUMS "^\| pp512 |GPU time of one 512|^\| (group_sum|rmsnorm|gelu_mul|qmm_coop_glu)"
date -u | tee -a "$F"
