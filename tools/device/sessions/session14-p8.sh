#!/usr/bin/env bash
# Session 14, eighth call: which rows or keys of P·V go wrong: every row of a 32-token tile attends
# to one key, (7 r + 3) % 16 (KESTREL_ATTN_COOP_DEBUG=P), V = identity, at value-row strides 10
# and 6. ≈ 1 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-rows.txt"
date -u | tee "$F"
for v in 10 6; do for pa in 1 0; do
  echo "== VTS=$v PA=$pa" | tee -a "$F"
  KESTREL_ATTN_COOP_PA=$pa KESTREL_ATTN_COOP_VTS=$v KESTREL_ATTN_COOP_DEBUG=P KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "^P row|panicked" | grep -v "|rest| 0.000" | tee -a "$F"
done; done
