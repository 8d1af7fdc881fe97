#!/usr/bin/env bash
# Session 14, fourth call: attention_coop's softmax weights against the CPU's (V = identity:
# o is the weights), in the VT form that passed p3's one-key case and the plain one, then the
# VT form's kernel test case by case. ≈ 1 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-weights.txt"
date -u | tee "$F"
for form in "KESTREL_ATTN_COOP_VT=1" "X=0"; do
  echo "== weights, $form" | tee -a "$F"
  env $form KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "tokens|gpu|cpu|panicked" | tee -a "$F"
done
echo "== kernel test, VT form" | tee -a "$F"
KESTREL_ATTN_COOP_VT=1 KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored 2>&1 | grep -E "attention_coop\(" | tee -a "$F"
date -u | tee -a "$F"
