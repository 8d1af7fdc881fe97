#!/usr/bin/env bash
# Session 23, fifth call: what one dispatch can stream at the decode mat-vecs' sizes. kbench's
# stream table (stream_read.wgsl: a read-only stream, 1, 2, 4 or 8 vec4s per thread loaded at
# once; copy: read and write; 1 MiB to 256 MiB and the E4B q|k|v, down and gate|up weight sizes,
# from memory, in a dependent chain), its kernel test, then the production mat-vecs of those
# shapes (kbench qmv rows) in the same call. ≈ 1 min warm. Carry target/carry (pack.sh --tests)
# and .gl. The fourth call ran these commands with stream_read's first form (a grid-stride loop
# of 4 vec4s per thread, each load after the one before; output
# benches/results/2026-12-02-h200-session23-p4-stream.txt); its script is this one.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5-stream.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests stream_read 2>&1 | grep -E "^test |test result|panicked" | tee -a "$F"
echo "== kbench stream_read" | tee -a "$F"
KBENCH_SHAPES=none timeout 300 ./target/release/kbench stream_read 2>&1 | grep -E "^copy|^\| |error" | tee -a "$F"
echo "== kbench qmv, E4B shapes" | tee -a "$F"
KBENCH_SHAPES="E4B q|k|v,E4B gate|up,E4B down" timeout 150 ./target/release/kbench qmv 2>&1 | grep -E "^\| E4B .* qmv_q4_t1_|^copy" | tee -a "$F"
date -u | tee -a "$F"
