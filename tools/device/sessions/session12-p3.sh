#!/usr/bin/env bash
# Session 12, call 3: (a) the modelled split rule of qmm_coop against the workgroup threshold
# (KESTREL_QMM_SPLIT_RULE=workgroups): kbench's picks, the fixtures, pp512 on E4B, E2B, 26B;
# (b) the decode attention's key splits (KESTREL_ATTN_SPLITS = 32, 16, 8) at a 512-token context,
# tg128 on E4B and E2B. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/split-rules.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ" | tee -a "$F"
./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B .*\*" | tee -a "$F"
for a in e4b e2b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in model workgroups model workgroups; do
    echo "== $a KESTREL_QMM_SPLIT_RULE=$r" | tee -a "$F"
    KESTREL_QMM_SPLIT_RULE=$r $K bench --model /tmp/$a -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| (qmm_|gelu_mul)" | tee -a "$F"
  done
  for s in 32 16 8 32 16 8; do
    echo "== $a KESTREL_ATTN_SPLITS=$s" | tee -a "$F"
    KESTREL_ATTN_SPLITS=$s $K bench --model /tmp/$a -p 512 -n 128 2>&1 | grep -E "tg128|decode step:|^\| attention_(split|combine)" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
$K synth --arch 26b-a4b --quant 4bit /tmp/26b > /dev/null 2>&1
for r in model workgroups; do
  echo "== 26b KESTREL_QMM_SPLIT_RULE=$r" | tee -a "$F"
  KESTREL_QMM_SPLIT_RULE=$r $K bench --model /tmp/26b -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| (qmm_|gelu_mul)" | tee -a "$F"
done
date -u | tee -a "$F"
