#!/usr/bin/env bash
# Session 14, eleventh call: attention_coop's pieces in the full kernel (a 32-token tile over two
# key tiles, V = identity): the first tile's scores left in o (KESTREL_ATTN_COOP_DEBUG=S), two
# keys per row at weights 1 : e^-0.3 (=P), and the real weights. ≈ 1 min.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-pieces.txt"
date -u | tee "$F"
for form in "KESTREL_ATTN_COOP_DEBUG=S" "KESTREL_ATTN_COOP_DEBUG=P" "X=0"; do
  echo "== $form" | tee -a "$F"
  env $form KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "row|worst|panicked" | head -40 | tee -a "$F"
done
