#!/usr/bin/env bash
# Built in session 20 for the next session's first call (PERF_NOTES.md, session 20, next steps
# (0)): whether workgroups can hand each other values across a WGSL grid barrier as atomics
# (kbench grid_barrier_atomic: stale reads and cost per barrier at 132 / 264 / 528 workgroups,
# beside the plain form that session 7 found stale), the question a "last workgroup does the
# follower's work" decode fusion in WGSL depends on; first final_checks (the kernel tests —
# grid_barrier's runs both forms on one workgroup —, the fixtures, the 256 MiB mat-vec).
# ≈ 2 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-grid-barrier-atomic.txt"
final_checks "$F"
echo "== kbench grid_barrier (plain and atomic slots), copy" | tee -a "$F"
timeout 120 ./target/release/kbench grid_barrier 2>&1 | grep -E "^\| (copy|grid_barrier)" | tee -a "$F"
date -u | tee -a "$F"
