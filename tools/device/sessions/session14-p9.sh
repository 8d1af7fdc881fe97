#!/usr/bin/env bash
# Session 14, ninth call: the first value stage as staged in workgroup memory, read back by plain
# threads (KESTREL_ATTN_COOP_DEBUG=V, V = identity): do keys 12..15 land? ≈ 1 min.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-vstage.txt"
date -u | tee "$F"
for v in 6 10; do
  echo "== VTS=$v" | tee -a "$F"
  KESTREL_ATTN_COOP_VTS=$v KESTREL_ATTN_COOP_DEBUG=V KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "^V key|panicked" | tee -a "$F"
done
