#!/usr/bin/env bash
# Session 10, probe 3: x copied whole into workgroup memory before the decode mat-vec's loop
# (KESTREL_QMV_XW=1, qmv_xw.wgsl: one barrier, then the unstaged loop reading x there; decode
# forms with cols ≤ 4096) against the default (staged rounds for ≤ 32 lanes, x from L2 above).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
for a in e2b e4b 26b-a4b; do ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1; done
ab_run "$F" e4b
ab_run "$F" e4b KESTREL_QMV_XW=1
ab_run "$F" e4b KESTREL_QMV_XW=1 KESTREL_FUSE_NORMS=all
ab_run "$F" e4b
ab_run "$F" e2b
ab_run "$F" e2b KESTREL_QMV_XW=1
ab_run "$F" 26b-a4b
ab_run "$F" 26b-a4b KESTREL_QMV_XW=1
date -u | tee -a "$F"
