#!/usr/bin/env bash
# Session 14, sixth call: attention_coop's first-tile scores against the CPU's
# (KESTREL_ATTN_COOP_DEBUG=S), its P·V with one chosen key per row (=P: o row r = V row r % 16,
# V = identity), and the weights again. ≈ 1 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-debug.txt"
date -u | tee "$F"
for form in "KESTREL_ATTN_COOP_DEBUG=S" "KESTREL_ATTN_COOP_DEBUG=P" "X=0"; do
  echo "== weights diagnostic, $form" | tee -a "$F"
  env $form KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "tokens|gpu|cpu|panicked" | tee -a "$F"
done
