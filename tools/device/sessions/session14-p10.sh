#!/usr/bin/env bash
# Session 14, tenth call: the value stage laid out as the score stage's keys (64 keys × 64 dims,
# [dim][key], loaded as K is: p8/p9 showed the staged values right in workgroup memory and keys
# 12..15 of a 16-key, 48- or 80-byte-row stage misread by the tensor-core load). The weights
# diagnostic and the kernel test, then, if it passes, the fixtures, kbench's attention rows and
# pp512 0 / 1 / 0 / 1 on E2B, E4B and 26B. ≈ 5 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "tokens 16 pos0 0 row 15" -A2 | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/t.log 2>&1
echo "OK cases: $(grep -c ' OK$' /tmp/t.log), FAIL: $(grep -c 'FAIL' /tmp/t.log)" | tee -a "$F"
grep -E "attention_coop\(|test result" /tmp/t.log | tee -a "$F"
grep -q "test result: ok" /tmp/t.log || exit 0
attn_ab "$F" X=0
date -u | tee -a "$F"
