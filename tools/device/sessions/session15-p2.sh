#!/usr/bin/env bash
# Session 15 #2 (PERF_NOTES.md): qmm_coop with exact f16 weights s·(q − 8) and the bias part
# b'·Σx as one tensor-core step per 8 quantisation groups (two products per 16-deep k step
# instead of three, one weight half staged instead of two). The tensor-core kernel tests and
# the fixtures with the new kernels, then the same call's A/B against the session's base
# binaries (kbench_base, kestrel_base: 2d51f3b, carried as target/carry/*_base.gz): kbench's
# qmm_coop rows twice each, pp512 on E2B, E4B and 26B (base, new, base, new). ≈ 7 min.
# Carry target/carry (tools/device/pack.sh --tests, then the base binaries copied in) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-coop-exact-w.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests coop --include-ignored --nocapture > /tmp/t.txt 2>&1
grep -cE " OK$" /tmp/t.txt | sed 's/^/tensor-core cases OK: /' | tee -a "$F"
grep -E "panicked|FAIL|test result" /tmp/t.txt | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
for i in 1 2; do
  for b in kbench_base kbench; do
    echo "== $b qmm_coop" | tee -a "$F"
    timeout 120 ./target/release/$b qmm_coop 2>&1 | grep -E "^\| E[24]B .*qmm_coop" >> "$F"
  done
done
grep -E "gate\\|up|down" "$F" | grep -E "128x128 \| 1 " | head -8
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for b in kestrel_base kestrel kestrel_base kestrel; do
    echo "== $a $b" | tee -a "$F"
    ./target/release/$b bench --model /tmp/$a -p 512 -n 8 2>&1 | grep -E "^\| pp512 |GPU time of one 512|^\| qmm_coop" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
