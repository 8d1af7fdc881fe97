#!/usr/bin/env bash
# Planned first call of session 15 (PERF_NOTES.md, session 14, next steps (1a)): attention_coop's
# 16-query, 128-thread form (KESTREL_ATTN_COOP_BQ=16: 256 workgroups on E4B's sliding layers
# instead of 128, two per SM), built in session 14 after its device time was spent. Both forms'
# kernel tests and qmm_coop's, the fixtures with the new form, kbench's prefill attention rows
# (SIMT, 32 and 16 queries), then pp512 with KESTREL_ATTN_COOP_BQ 32 / 16 / 32 / 16 on E2B, E4B
# and 26B. ≈ 5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-q16.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests coop --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_ATTN_COOP_BQ=16" | tee -a "$F"
KESTREL_ATTN_COOP_BQ=16 KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
echo "== kbench prefill attention" | tee -a "$F"
timeout 120 ./target/release/kbench attention 2>&1 | grep -E "^\| (E2B|E4B) " | tee -a "$F"
AB_VALUES="32 16 32 16" pp_ab "$F" KESTREL_ATTN_COOP_BQ "^\| pp512 |GPU time of one 512|^\| attention_(d|coop)"
date -u | tee -a "$F"
