#!/usr/bin/env bash
# The dense tensor-core mat-mat's fixed cost per workgroup (PERF_NOTES.md, session 18: E4B's
# down projection at 1–8 splits fits ≈ 10–14 µs per workgroup round above its stages). Needs
# binaries built with tools/experiments/qmm-coop-fixed-cost.patch applied (wrong-output
# probes): kbench's 128 × 128 rows as built, then with one stage per workgroup (no bias tail),
# one stage and one bias step, and every stage without the bias tail; each twice. ≈ 4 min.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-fixed-cost.txt"
date -u | tee "$F"
for c in none one one_tail notail none one one_tail notail; do
  echo "== kbench qmm_coop_q4_128x128 KESTREL_QMM_CEIL=$c" | tee -a "$F"
  KESTREL_QMM_CEIL=$c timeout 120 ./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
date -u | tee -a "$F"
