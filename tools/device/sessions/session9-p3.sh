#!/usr/bin/env bash
# Session 9, probe 3: qmm_coop storing its f16 halves as whole vec4<f16> (one 8-byte store per
# four values; coopLoad's stride in vec4s): the kernel test, kbench's 128×128 rows, pp512 of
# E4B and E2B (default tile). Carry target/carry (tools/device/pack.sh --tests) and .gl.
# FIXTURES=1 also runs tests/fixtures.rs's wgpu tests after the kernel test; F=FILE names the
# output.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/p3.txt}"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm_coop 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
[ "${FIXTURES:-0}" = 1 ] && KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|mlx-4bit prompt 0" | tee -a "$F"
./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E" | tee -a "$F"
for arch in e4b e2b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 16 2>&1 | grep -E "pp512|qmm|GPU time of one 512" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
