#!/usr/bin/env bash
# Session 35, p2: what the 26B's router costs in the pipelined decode step, by leaving it out
# (KESTREL_SKIP: wrong output, timings only; session 25 #2 measured router + top-k together at
# 22 µs a layer on the H200): defaults / no top-k / no router mat-vec / neither, twice. The ceiling
# of folding the router into the post-attention norm's dispatch. ≈ 3.5 min warm.
# Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P="tg128|decode step:|^\| (router|matmul_q8|rmsnorm|moe_norm)"
tg_ab "$F" "26b-a4b" "$P" KESTREL_DEFAULTS=1 KESTREL_SKIP=router_topk KESTREL_SKIP=matmul_q8 KESTREL_SKIP=router_topk,matmul_q8
echo "== end ($(date -u +%T))" | tee -a "$F"
