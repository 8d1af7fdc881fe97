#!/usr/bin/env bash
# Session 18, after the final call: decode's norms at 1024 threads on E2B and 26B (the final
# call measured E4B: tg128 207.4 / 207.4 → 208.4 / 208.6), tg128 256 / 1024 twice each.
# Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/rmsnorm-wg.txt"
date -u | tee "$F"
for a in 26b-a4b e2b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for w in 256 1024 256 1024; do ab_run "$F" $a KESTREL_RMSNORM_WG=$w; done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
