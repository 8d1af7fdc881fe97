#!/usr/bin/env bash
# Session 9, probe 1: the tensor-core prefill mat-mat (qmm_coop.wgsl) on the H200 — its kernel
# test (ignored elsewhere: lavapipe has no cooperative matrices), the fixtures end to end with
# it in prefill, then pp512 of E2B and E4B
# with it and without it (KESTREL_QMM_COOP=0) in the same binary.
# Carry target/release/{kestrel,ktests,kfixtures} (stripped) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/p1.txt"
date -u | tee "$F"
echo "== tests/kernels.rs qmm (incl. the ignored qmm_coop test)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm 2>&1 | grep -E "^test |test result|FAIL|panicked|NMSE" | tail -60 | tee -a "$F"
echo "== tests/fixtures.rs wgpu_matches_transformers (prefill through qmm_coop)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu_matches_transformers --nocapture 2>&1 | tail -25 | tee -a "$F"


for arch in e2b e4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for coop in 1 0 1; do
    echo "== $arch KESTREL_QMM_COOP=$coop" | tee -a "$F"
    KESTREL_QMM_COOP=$coop $K bench --model /tmp/$arch -p 512 -n 16 2>&1 | grep -E "pp512|tg16|qmm|GPU time of one 512" | tee -a "$F"
  done
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
