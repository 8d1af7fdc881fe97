#!/usr/bin/env bash
# Session 9, probe 7: the GeGLU in the tensor-core mat-mat's epilogue (qmm_coop_glu.wgsl: the
# stacked gate|up mat-mat and gelu_mul in one dispatch): its kernel cases and the fixtures on the
# H200, then E4B pp512 with it and without it (KESTREL_QMM_COOP_GLU=0) in the same binary.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/p7.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm_coop 2>&1 | grep -E "^test |test result|FAIL|panicked|glu" | head -20 | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|mlx-4bit prompt 0 \(chunk 128\)" | tee -a "$F"
$K synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for glu in 1 0; do
  echo "== e4b KESTREL_QMM_COOP_GLU=$glu" | tee -a "$F"
  KESTREL_QMM_COOP_GLU=$glu $K bench --model /tmp/e4b -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| (qmm|gelu)" | tee -a "$F"
done
date -u | tee -a "$F"
