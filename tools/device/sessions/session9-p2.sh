#!/usr/bin/env bash
# Session 9, probe 2: qmm_coop with the low halves scaled by 2^11 (p1 lost them: the H200 drops
# subnormal f16 halves) and four tiles (rows × tokens 64×64, 64×128, 128×64, 128×128): its kernel
# test, the fixtures end to end, kbench's prefill table, then E4B pp512 per tile and without it.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/p2.txt"
date -u | tee "$F"
echo "== tests/kernels.rs qmm (incl. the ignored qmm_coop test)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm 2>&1 | grep -E "^test |test result|FAIL|panicked|coop.*NMSE" | tail -40 | tee -a "$F"
echo "== tests/fixtures.rs (prefill through qmm_coop)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== kbench qmm" | tee -a "$F"
./target/release/kbench qmm 2>&1 | grep -E "^\| E|^\| 256|device|roofline" | tee -a "$F"
$K synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for t in 2x2 1x2 1x4 2x4 off; do
  echo "== e4b tile $t" | tee -a "$F"
  if [ $t = off ]; then v="KESTREL_QMM_COOP=0"; else v="KESTREL_QMM_COOP_TILE=$t"; fi
  env $v $K bench --model /tmp/e4b -p 512 -n 16 2>&1 | grep -E "pp512|qmm|GPU time of one 512" | tee -a "$F"
done
date -u | tee -a "$F"
