#!/usr/bin/env bash
# Session 34, p2: the routed experts on integer digits (qmv_moe.wgsl's DIGITS: each workgroup
# copies its slot's x into workgroup memory as dot32i's digits, qmv_digits.wgsl, and the loop
# multiplies packed nibbles by them); p1's E2B change on this card; and whether the fused-norm
# forms, now on digits, win past 2048 (sessions 25 and 30 found them losing there on the float
# loop). Decode A/B (env.sh's tg_ab), one process each, alternating, two rounds: the 26B with
# digits off / on for gate_up only (KESTREL_QMV_DIGITS=gate) / on for both (defaults); E2B with
# digits off (session 33's float loop) / the defaults; E4B with the defaults / every residual
# norm fused (KESTREL_FUSE_NORMS=all) / fused into the gated and GeGLU mat-vecs (=glu). Then the
# expert tests at the defaults (the kernel tests and fixtures run in the final call). ≈ 9.5 min
# warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P="tg128|decode step:|^\| (qmv_|rmsnorm)"
tg_ab "$F" "26b-a4b" "$P" KESTREL_QMV_DIGITS=0 KESTREL_QMV_DIGITS=gate KESTREL_DEFAULTS=1
tg_ab "$F" "e2b" "$P" KESTREL_QMV_DIGITS=0 KESTREL_DEFAULTS=1
tg_ab "$F" "e4b" "$P" KESTREL_DEFAULTS=1 KESTREL_FUSE_NORMS=all KESTREL_FUSE_NORMS=glu
echo "== kexperts ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/kexperts 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
