#!/usr/bin/env bash
# Session 14, thirteenth call: which construct corrupts attention_coop's scores (exact when the
# kernel stops after them, wrong in the full kernel): the first tile's scores (DEBUG=S) with the
# rescale flag 16 bytes wide (NEED16), without the rescale path (NORS), both, and the
# early-return form (S0), each with Kestrel's GLSL450 SPIR-V and wgpu's. ≈ 1 min.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-scores.txt"
date -u | tee "$F"
for sp in 1 0; do
for form in "KESTREL_ATTN_COOP_DEBUG=S0" "KESTREL_ATTN_COOP_DEBUG=S" "KESTREL_ATTN_COOP_DEBUG=S KESTREL_ATTN_COOP_NEED16=1" "KESTREL_ATTN_COOP_DEBUG=S KESTREL_ATTN_COOP_NORS=1" "KESTREL_ATTN_COOP_DEBUG=S KESTREL_ATTN_COOP_NEED16=1 KESTREL_ATTN_COOP_NORS=1" "KESTREL_ATTN_COOP_DEBUG=P" "X=0"; do
  echo "== SPIRV=$sp $form" | tee -a "$F"
  env KESTREL_COOP_SPIRV=$sp $form KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "worst|panicked" | tee -a "$F"
done; done
