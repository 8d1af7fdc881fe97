#!/usr/bin/env bash
# Session 34, p3: two changes that should move no time, checked on the card: qmv's loops load a
# chunk's weights, scale and bias through one function (chunk_w) and the wgpu program recorder's
# `record` is split into one method per block (a move). `kestrel_base` is 1b267d9's binary (the
# defaults p2 and the table measured), carried beside the new one (target/carry/kestrel_base.gz).
# Decode, alternating base / new, two rounds on E2B and the 26B, then the fixtures end to end
# with the new binaries. ≈ 4.5 min warm. Carry target/carry (pack.sh --tests plus
# kestrel_base.gz) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P="tg128|decode step:"
for a in e2b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    BIN=kestrel_base ab_bench "$F" $a "-p 16 -n 128" "$P" KESTREL_DEFAULTS=1
    ab_bench "$F" $a "-p 16 -n 128" "$P" KESTREL_DEFAULTS=1
  done
  rm -rf /tmp/$a
done
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
