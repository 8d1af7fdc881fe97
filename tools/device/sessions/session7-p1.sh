#!/usr/bin/env bash
# Session 7, first call: the kernel tests on the H200 at HEAD, then probe.sh's qmv sweep (with the
# memory column) and grid_barrier rows, then `kestrel bench` on the three archs (checks off).
set -uo pipefail
. tools/device/env.sh
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | tail -15 | tee "$OUT/ktests.txt"
KFILTERS="qmv_q4_t1 grid_barrier" ARCHS="e2b e4b 26b-a4b" CHECKS=0 bash tools/device/probe.sh
