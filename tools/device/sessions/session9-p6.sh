#!/usr/bin/env bash
# Session 9, probe 6 (lost, reverted; tools/experiments/qmm-coop-double-buffer.patch):
# qmm_coop_core.wgsl double-buffered (16-value stages in two buffers, one barrier per stage):
# session9-final.sh with kbench's qmm_coop rows (E4B shapes) after the tests. Carry target/carry
# built with the patch applied (tools/device/pack.sh --tests) and .gl.
OUT=${OUT:-/tmp/out}
F="$OUT/p6.txt" KBENCH_FILTER=qmm_coop exec bash tools/device/sessions/session9-final.sh
