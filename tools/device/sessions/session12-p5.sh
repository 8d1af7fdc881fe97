#!/usr/bin/env bash
# Session 12, call 5: rmsnorm with V = ceil(n / 256) registers per array (the default now)
# against V = 12 (KESTREL_RMSNORM_V=12, the former constant): GPU time of a 512-token chunk and
# its rmsnorm rows on E2B and E4B, and kbench's one-workgroup ladder with each.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/rmsnorm-v.txt"
K=./target/release/kestrel
date -u | tee "$F"
for v in 0 12; do
  echo "== kbench KESTREL_RMSNORM_V=$v" | tee -a "$F"
  KESTREL_RMSNORM_V=$v ./target/release/kbench rmsnorm 2>&1 | grep -E "^\| rmsnorm " | tee -a "$F"
done
for a in e2b e4b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for v in 0 12; do
    echo "== $a KESTREL_RMSNORM_V=$v" | tee -a "$F"
    KESTREL_RMSNORM_V=$v $K bench --model /tmp/$a -p 512 -n 16 2>&1 | grep -E "pp512|tg16|GPU time of one 512|^\| rmsnorm" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
