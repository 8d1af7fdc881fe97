#!/usr/bin/env bash
# Session 38, p2: the ceiling of folding Gemma 4's per-layer-input gate and projection into one
# dispatch. E2B and E4B decode steps with the projection (qmv_q4_t1_l8_r1: 1536 / 2560 × 256,
# one a layer) or the gate (qmv_gelu_b…: 256 × hidden with the fused norm) left out
# (KESTREL_SKIP, wrong output: timings only), against the defaults, two rounds.
# Carry target/carry/kestrel.gz and .gl. ≈ 3 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$F"
tg_ab "$F" "e2b e4b" "tg128|decode step:" KESTREL_DEFAULTS=1 KESTREL_SKIP=qmv_q4_t1_l8_r1 KESTREL_SKIP=qmv_gelu_b
echo "== end ($(date -u +%T))" | tee -a "$F"
