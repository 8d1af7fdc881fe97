#!/usr/bin/env bash
# Session 5's measurements in one device call: the single-kernel tables (prefill qmm variants at
# 512 tokens, the decode qmv sweep, the small decode kernels' latency), then `kestrel bench` on
# E2B and E4B with naga's shader runtime checks on and off (KESTREL_SHADER_CHECKS=0).
# Carry target/release/kestrel, target/release/kbench and .gl (see PERF_NOTES.md).
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
KB=./target/release/kbench
date | tee "$OUT/probe.txt"
for f in ${KFILTERS:-qmm qmv_q4_t1 rmsnorm attention qkv router copy}; do
  extra=""; [ "$f" = qmv_q4_t1 ] && extra="--sweep"
  echo "== kbench $f $extra" | tee -a "$OUT/probe.txt"
  $KB $f $extra 2>&1 | grep -v "^$" | tee -a "$OUT/probe.txt"
done
for arch in ${ARCHS:-e2b e4b}; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for checks in ${CHECKS:-1 0}; do
    echo "== $arch checks=$checks" | tee -a "$OUT/probe.txt"
    KESTREL_SHADER_CHECKS=$checks $K bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a "$OUT/probe.txt"
  done
  rm -rf /tmp/$arch
done
