#!/usr/bin/env bash
# Session 34, p1: the fused-norm mat-vecs on integer digits (qmv_norm.wgsl's DIGITS: the
# prologue turns each 32-value chunk of the normed input into dot32i's digits once per
# workgroup, the loop multiplies packed nibbles by them, four products an instruction). The
# fused consumers are E2B's q|k|v, GeGLU and per-layer gate and E4B's per-layer gate; E2B's
# GeGLU (35 dispatches, ≈ 19 µs each in the step for ≈ 15 MB) ran the float loop at ≈ 5
# instructions a weight. Decode A/B (env.sh's tg_ab), one process each, alternating
# KESTREL_QMV_DIGITS=0 (the float loop, session 33's code) and the defaults, two rounds; on E2B
# also the GeGLU at 16 lanes × 2 pairs and 8 lanes × 2 pairs with digits (fewer redundant
# prologues, now the loop is cheaper). Then the fused-norm kernel cases, the tile-bitwise test
# and the fixtures at the defaults. ≈ 6 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
P="tg128|decode step:|^\| qmv_"
tg_ab "$F" "e2b" "$P" KESTREL_QMV_DIGITS=0 KESTREL_DEFAULTS=1 KESTREL_QMV_TILES=12288x1536=16x4,24576x1536=16x4 KESTREL_QMV_TILES=12288x1536=8x4,24576x1536=8x4
tg_ab "$F" "e4b" "$P" KESTREL_QMV_DIGITS=0 KESTREL_DEFAULTS=1
echo "== ktests every_kernel (_norm_) and the tile-bitwise test at the defaults ($(date -u +%T))" | tee -a "$F"
KESTREL_KERNELS=_norm_ KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests every_kernel qmv_rows_are_bitwise --nocapture 2>&1 | grep -E "FAIL|test result|panicked|^qmv.*norm" | tee -a "$F"
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
