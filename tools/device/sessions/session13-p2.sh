#!/usr/bin/env bash
# Session 13, x split once per chunk (PERF_NOTES.md, session 13): the tensor-core test with the
# pre-split forms (split_halves then qmm_coop_xs, copied or direct), then kbench's tensor-core
# rows of E2B and E4B: the 128 × 128 tile as staged now against split_halves + each pre-split
# form, every k split. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/split-halves.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm_coop --nocapture > /tmp/t.txt 2>&1
grep -cE "qmm_coop_xs.*OK" /tmp/t.txt | sed 's/^/pre-split cases OK: /' | tee -a "$F"
grep -E "panicked|FAIL|test result" /tmp/t.txt | head -20 | tee -a "$F"
for i in 1 2; do
  ./target/release/kbench qmm_coop 2>&1 | grep -E "^\| E[24]B .*qmm_coop(_xs[cd])?_q4_128x128" | tee -a "$F"
done
date -u | tee -a "$F"
