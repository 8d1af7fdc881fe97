#!/usr/bin/env bash
# Session 9, probe 4: qmm_coop with exact f16 weights s·(q − 8) and the bias b'·Σx as a tensor-core step
# (no split of w): the kernel test, the fixtures, kbench's 128×128 rows, pp512 of
# E4B and E2B (default tile). Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/p4.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm_coop 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|mlx-4bit prompt 0" | tee -a "$F"
./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E" | tee -a "$F"
for arch in e4b e2b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 16 2>&1 | grep -E "pp512|qmm|GPU time of one 512" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
