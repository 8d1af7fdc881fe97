#!/usr/bin/env bash
# Session 24, fourth call: x staged whole in workgroup memory for the unstaged decode mat-vecs
# (KESTREL_QMV_XS=1, qmv_xstage.wgsl) and the one-word scale+bias ceiling (KESTREL_QMV_CEIL=sb1).
# The kernel tests and fixtures with XS on; kbench's decode qmv rows off / on / sb1; decode A/B
# (-p 16 -n 128) on E2B, E4B (0/1/0/1) and 26B (0/1). ≈ 6 min warm. Carry target/carry and .gl.
# Build with tools/experiments/qmv-xstage.patch and qmv-ceilings-session24.patch applied (neither
# knob is in the tree).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4-xstage.txt"
date -u | tee "$F"
echo "== ktests qmv + fixtures, KESTREL_QMV_XS=1" | tee -a "$F"
KESTREL_QMV_XS=1 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests 2>&1 | grep -E "test result|FAIL|panicked" | tee -a "$F"
KESTREL_QMV_XS=1 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|differ" | tee -a "$F"
S="E2B q|k|v,E2B down,E4B q|k|v,E4B down,E4B q_proj"
for v in "KESTREL_QMV_XS=0" "KESTREL_QMV_XS=1" "KESTREL_QMV_CEIL=sb1"; do
  echo "== kbench qmv $v ($(date -u +%T))" | tee -a "$F"
  env $v KBENCH_SHAPES="$S" timeout 120 ./target/release/kbench qmv_q4_t1 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|error" | tee -a "$F"
done
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  vals="0 1 0 1"; [ $a = 26b-a4b ] && vals="0 1"
  for s in $vals; do ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:|^\| qmv_q4" KESTREL_QMV_XS=$s; done
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
