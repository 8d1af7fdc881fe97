#!/usr/bin/env bash
# The register-tiled prefill attention (attention_tiled.wgsl, KESTREL_ATTN_CHUNK=tiled) against
# the default (attention.wgsl): its kernel cases and the fixtures end to end on the H200, kbench's
# prefill attention rows (both forms), and pp512 on E2B and E4B with the knob off and on.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
# Ran in session 12 at 8fd03b4 (benches/results/2026-12-01-h200-session12-p1-*); the knob is gone
# since: the tiled form won and became attention.wgsl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-tiled.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 KESTREL_KERNELS=attention ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^attention|test result" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 KESTREL_ATTN_CHUNK=tiled ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL" | tee -a "$F"
./target/release/kbench attention_ 2>&1 | grep -E "^\| E[24]B (sliding|full)" | tee -a "$F"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for v in default tiled default tiled; do
    echo "== $a KESTREL_ATTN_CHUNK=$v" | tee -a "$F"
    KESTREL_ATTN_CHUNK=$v ./target/release/kestrel bench --model /tmp/$a -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| attention_" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
