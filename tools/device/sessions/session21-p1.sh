#!/usr/bin/env bash
# Built in session 20 for the next session's first call (PERF_NOTES.md, session 20, next steps
# (0)): whether workgroups can hand each other values across a WGSL grid barrier as atomics
# (kbench grid_barrier_atomic: stale reads and cost per barrier at 132 / 264 / 528 workgroups,
# beside the plain form that session 7 found stale), the question a "last workgroup does the
# follower's work" decode fusion in WGSL depends on; then (session 21) kbench last_workgroup, that
# hand-off itself (shares stored plain or as atomics, read by the last-arriving workgroup after
# an atomic arrival count: stale reads over 2000 dispatches, µs per dispatch); first final_checks (the kernel tests —
# grid_barrier's runs both forms on one workgroup —, the fixtures, the 256 MiB mat-vec).
# ≈ 2 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-grid-barrier-atomic.txt"
final_checks "$F"
echo "== kbench grid_barrier (plain and atomic slots), copy" | tee -a "$F"
timeout 120 ./target/release/kbench grid_barrier 2>&1 | grep -E "^\| (copy|grid_barrier)" | tee -a "$F"
echo "== kbench last_workgroup (shares handed to the last-arriving workgroup, plain and atomic)" | tee -a "$F"
timeout 120 ./target/release/kbench last_workgroup 2>&1 | grep -E "^\| (copy|last_workgroup)" | tee -a "$F"
echo "== kbench copy (the dependent-dispatch floor)" | tee -a "$F"
timeout 120 ./target/release/kbench copy 2>&1 | grep -E "^\\| copy" | tee -a "$F"
date -u | tee -a "$F"
