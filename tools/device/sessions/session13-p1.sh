#!/usr/bin/env bash
# Planned first call of session 13 (PERF_NOTES.md, session 12, next steps): steps submitted in
# segments as they are recorded (KESTREL_SUBMIT_SEGMENTS=1) against one submit per step (0, the
# default): the fixtures with it on the H200, then pp512 (wall: what the segments should move;
# the GPU chunk time should not) and the verify rows on E2B, E4B and 26B, two runs each; tg128
# with rmsnorm's row-sized registers (b1be228) at 128 tokens in the same runs.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/submit-segments.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_SUBMIT_SEGMENTS=1 KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ" | tee -a "$F"
for a in e2b e4b 26b-a4b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 0 1 0 1; do
    ab_bench "$F" $a "-p 512 -n 128" "^\| (pp512|tg128|[1-5]) |GPU time of one 512|decode step:" KESTREL_SUBMIT_SEGMENTS=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
