#!/usr/bin/env bash
# Session 18, second call: the dense tensor-core mat-mat storing its whole tiles straight to y
# (KESTREL_QMM_DIRECT=1: coopStoreT into the output buffer, no round trip through workgroup
# memory and no two barriers per 16 × 16 block). qmm_coop's kernel test (a tensor-core test,
# ignored on lavapipe) and the fixtures with it on; kbench's 128 × 128 rows (every shape and k
# split) off / on / off / on; pp512 0 / 1 / 0 / 1 on E2B and E4B. Then the sliding layers' head
# norms at 64 threads per head against the default 128 (E4B, pp512). ≈ 5 min. Carry
# target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-direct.txt"
date -u | tee "$F"
echo "== tests/kernels.rs qmm_coop, KESTREL_QMM_DIRECT=1" | tee -a "$F"
KESTREL_QMM_DIRECT=1 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests --include-ignored qmm_coop 2>&1 | grep -E "^test |test result|FAIL|panicked|NMSE" | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_QMM_DIRECT=1" | tee -a "$F"
KESTREL_QMM_DIRECT=1 KESTREL_REQUIRE_GPU=1 timeout 150 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then echo "a test failed: no benchmarks" | tee -a "$F"; exit 1; fi
for d in 0 1 0 1; do
  echo "== kbench qmm_coop_q4_128x128 KESTREL_QMM_DIRECT=$d" | tee -a "$F"
  KESTREL_QMM_DIRECT=$d timeout 120 ./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
PP_ARCHS="e2b e4b" pp_ab "$F" KESTREL_QMM_DIRECT "^\| pp512 |GPU time of one 512|^\| qmm_coop"
PP_ARCHS=e4b AB_VALUES="128 64 128 64" pp_ab "$F" KESTREL_HEAD_NORM_WG "^\| pp512 |GPU time of one 512|^\| (qkv|head)_norm_rope"
date -u | tee -a "$F"
