#!/usr/bin/env bash
# Session 11, probe 5: with the integer-dot staged loop, the lanes × rows sweep on the LM heads
# and the stacked gate|up (plain qmv, weights from memory), then decode end to end with the
# tall tiles overridden (KESTREL_QMV_TILES) on E2B and E4B.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5.txt"
date -u | tee "$F"
KBENCH_SHAPES="LM head,E4B gate|up" ./target/release/kbench qmv_q4_t1_l --sweep 2>&1 | grep -E "^\| [0-9E]" | grep -E "_l(8|16|32)_" | tee -a "$F"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
./target/release/kestrel synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1
ab_run "$F" e4b X=0
ab_run "$F" e4b KESTREL_QMV_TILES=262144x2560=16x8
ab_run "$F" e4b KESTREL_QMV_TILES=20480x2560=16x4
ab_run "$F" e4b KESTREL_QMV_TILES=20480x2560=16x8
ab_run "$F" e2b X=0
ab_run "$F" e2b KESTREL_QMV_TILES=262144x1536=16x8
ab_run "$F" e2b KESTREL_QMV_TILES=12288x1536=16x4
date -u | tee -a "$F"
