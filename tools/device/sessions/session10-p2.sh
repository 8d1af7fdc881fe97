#!/usr/bin/env bash
# Session 10, probe 2: the fused-norm prologue form with wider workgroups (KESTREL_QMV_PRO_WG:
# 128 threads as before, 256, 512: more teams share one prologue, so fewer workgroups read the
# norm's inputs again), on E4B (fused at every size: KESTREL_FUSE_NORMS=all) and E2B (fused by
# default), against every norm its own dispatch; and the decode mat-vec's chunks per round
# (KESTREL_QMV_CU=3, 4; 2 is the default) on the default path. The kernel tests first.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | grep -E "^test |test result" | tee -a "$F"
for a in e2b e4b; do ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1; done
ab_run "$F" e4b KESTREL_FUSE_NORMS=0
for w in 128 256 512; do ab_run "$F" e4b KESTREL_FUSE_NORMS=all KESTREL_QMV_PRO_WG=$w; done
for c in 3 4; do ab_run "$F" e4b KESTREL_QMV_CU=$c; done
ab_run "$F" e2b KESTREL_FUSE_NORMS=0
for w in 128 256 512; do ab_run "$F" e2b KESTREL_QMV_PRO_WG=$w; done
for c in 3 4; do ab_run "$F" e2b KESTREL_QMV_CU=$c; done
date -u | tee -a "$F"
