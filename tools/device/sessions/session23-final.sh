#!/usr/bin/env bash
# Session 23, last call: the checks at the session's last commit (no default of the program
# changed this session, so session 22's table stands): final_checks (the kernel tests with the
# tensor-core ones, the fixtures end to end, the 256 MiB mat-vec against the copy roofline), then
# kbench's stream table once more with copy.wgsl and stream_read.wgsl on their shared bindings.
# ≈ 4 min. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
final_checks "$F"
echo "== kbench stream_read" | tee -a "$F"
KBENCH_SHAPES=none timeout 300 ./target/release/kbench stream_read 2>&1 | grep -E "^copy|^\| (stream|[0-9]|E4B)" | tee -a "$F"
date -u | tee -a "$F"
