#!/usr/bin/env bash
# Built in session 21 for the next session's first call (PERF_NOTES.md, session 21, next steps
# (0)): session 21's final call found moe_norm's bitwise check against the three dispatches it
# replaces failing on the H200 without printing the size of the difference; the test now asks
# NMSE ≤ 1e-11 and prints, per shape, the NMSE and how many values are bitwise equal. First
# final_checks (the kernel tests, that one among them; the fixtures; the 256 MiB mat-vec), then
# the moe_norm test alone with its output. ≈ 2 min. Carry target/carry (tools/device/pack.sh
# --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-moe-norm.txt"
final_checks "$F"
echo "== moe_norm against its three dispatches and the f64 reference" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests moe_norm --nocapture 2>&1 | grep -E "moe_norm|test result|panicked|NMSE" | tee -a "$F"
date -u | tee -a "$F"
