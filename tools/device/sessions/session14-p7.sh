#!/usr/bin/env bash
# Session 14, seventh call: p6 showed the scores exact and keys 12..15 of each value stage
# misread with 48-byte dim rows; value stages now use qmm_coop's 80-byte rows
# (KESTREL_ATTN_COOP_VTS=10, 128 dims per stage). The weights diagnostic and the kernel test at
# 10 and 6, then, if 10 passes, the fixtures, kbench's attention rows and pp512 0 / 1 / 0 / 1 on
# E2B, E4B and 26B. ≈ 5 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-vts.txt"
date -u | tee "$F"
for v in 10 6; do
  echo "== VTS=$v weights" | tee -a "$F"
  KESTREL_ATTN_COOP_VTS=$v KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "tokens 16 pos0 0 row 15" -A2 | tee -a "$F"
  echo "== VTS=$v kernel test" | tee -a "$F"
  KESTREL_ATTN_COOP_VTS=$v KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/t$v.log 2>&1
  echo "OK cases: $(grep -c ' OK$' /tmp/t$v.log), FAIL: $(grep -c 'FAIL' /tmp/t$v.log)" | tee -a "$F"
  grep -E "test result" /tmp/t$v.log | tee -a "$F"
done
grep -E "attention_coop\(" /tmp/t10.log | tee -a "$F"
grep -q "test result: ok" /tmp/t10.log || exit 0
attn_ab "$F" X=0
date -u | tee -a "$F"
