#!/usr/bin/env bash
# Session 14, fourteenth (last) call: attention_coop with its rescale flag 16 bytes wide (p13:
# the 4-byte flag misaligned the tensor-core arrays). Its kernel test and qmm_coop's, then, if it
# passes, the fixtures end to end, kbench's prefill attention rows and pp512 with
# KESTREL_ATTN_COOP 0 / 1 / 0 / 1 on E2B, E4B and 26B. ≈ 5 min. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/t.log 2>&1
echo "OK cases: $(grep -c ' OK$' /tmp/t.log), FAIL: $(grep -c 'FAIL' /tmp/t.log)" | tee -a "$F"
grep -E "FAIL|test result" /tmp/t.log | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests qmm_coop --include-ignored 2>&1 | grep -E "test result|panicked" | tee -a "$F"
grep -q "test result: ok" /tmp/t.log || exit 0
attn_ab "$F" X=0
date -u | tee -a "$F"
