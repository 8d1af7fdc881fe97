#!/usr/bin/env bash
# Planned second call of session 17 (PERF_NOTES.md, session 16): the PLE gate's gelu_mul adding
# its split-k gate's partials itself (KESTREL_GELU_SPLITS=1, off by default until measured: one
# qmm_sum dispatch fewer per layer on E2B and E4B), built in session 16 after its device time
# was spent. The fixtures end to end with it on, then pp512 with KESTREL_GELU_SPLITS 0 / 1 / 0 / 1
# on E4B and E2B (the 26B has no per-layer input). ≈ 3.5 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/gelu-splits.txt"
date -u | tee "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_GELU_SPLITS=1" | tee -a "$F"
KESTREL_GELU_SPLITS=1 KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
PP_ARCHS="e4b e2b" pp_ab "$F" KESTREL_GELU_SPLITS "^\| pp512 |GPU time of one 512|^\| (qmm_sum|gelu_mul)"
date -u | tee -a "$F"
