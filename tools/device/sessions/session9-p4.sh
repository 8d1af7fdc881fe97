#!/usr/bin/env bash
# Session 9, probe 4 (lost, reverted; tools/experiments/qmm-coop-exact-w.patch): qmm_coop with
# exact f16 weights s·(q − 8) and the bias b'·Σx as a tensor-core step (no split of w):
# session9-p3.sh with the fixtures. Carry target/carry built with the patch applied and .gl.
OUT=${OUT:-/tmp/out}
F="$OUT/p4.txt" FIXTURES=1 exec bash tools/device/sessions/session9-p3.sh
