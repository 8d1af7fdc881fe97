#!/usr/bin/env bash
# Session 14, second call: prefill attention on tensor cores (attention_coop.wgsl). Its kernel
# test (every attention case it takes, full-size E2B/E4B chunks, q ranges that move the running
# maximum), the fixtures end to end (their global layers, d 64, run it), kbench's prefill
# attention rows (both kernels, 512-token chunk), then pp512 with KESTREL_ATTN_COOP 0 / 1 / 0 / 1
# on E2B, E4B and 26B (the chunk profile's attention rows). ≈ 6 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop.txt"
date -u | tee "$F"
echo "== tests/kernels.rs attention_coop (ignored elsewhere)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests attention_coop --include-ignored 2>&1 | grep -E "attention_coop\(|test result|panicked|FAIL" | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
echo "== kbench prefill attention" | tee -a "$F"
timeout 120 ./target/release/kbench attention 2>&1 | grep -E "^\| (E2B|E4B) " | tee -a "$F"
pp_ab "$F" KESTREL_ATTN_COOP "^\| pp512 |GPU time of one 512|^\| attention"
date -u | tee -a "$F"
