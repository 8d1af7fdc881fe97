#!/usr/bin/env bash
# The dense tensor-core mat-mat's cost per round of workgroups (PERF_NOTES.md, session 19 #1: a
# round of one-stage workgroups takes ≈ 10 µs). Needs binaries built with
# tools/experiments/qmm-coop-round-cost.patch applied (wrong-output probes): kbench's 128 × 128
# rows as built, with one k stage per workgroup, that without the epilogue, that without global
# loads, and empty workgroups; each twice, and group_sum's rows (kbench adds its time to every
# tensor-core row). ≈ 5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl; KBENCH=path
# runs another kbench (e.g. target/release/kbench_probe, a patched build carried beside the
# default one as target/carry/kbench_probe.gz).
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-round-cost.txt"
date -u | tee "$F"
for c in none one noepi noload empty none one noepi noload empty; do
  echo "== kbench qmm_coop_q4_128x128 KESTREL_QMM_CEIL=$c" | tee -a "$F"
  KESTREL_QMM_CEIL=$c timeout 120 ${KBENCH:-./target/release/kbench} qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
echo "== kbench group_sum" | tee -a "$F"
timeout 60 ${KBENCH:-./target/release/kbench} group_sum 2>&1 | grep -E "group_sum" | tee -a "$F"
date -u | tee -a "$F"
