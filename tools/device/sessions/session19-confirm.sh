#!/usr/bin/env bash
# Session 19, after the final call: the bias steps loaded a step ahead in the dense tensor-core
# mat-mat only (the final call had them in the GeGLU and routed-expert forms too, which lost
# there). The fixtures end to end with this default, then prefill A/Bs of one binary, -p 512 -n 8:
# the default against KESTREL_QMM_BIAS_PF=0 (the session start's prefill), E4B twice, 26B, E2B.
# ≈ 2.5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/confirm.txt"
date -u | tee "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
PAT="^\| pp512 |GPU time of one 512|^\| qmm_coop"
for arch in e4b 26b-a4b e2b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  n=1; [ $arch = e4b ] && n=2
  for i in $(seq $n); do
    for v in KESTREL_QMM_BIAS_PF=1 KESTREL_QMM_BIAS_PF=0; do ab_bench "$F" $arch "-p 512 -n 8" "$PAT" $v; done
  done
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
