#!/usr/bin/env bash
# Session 11, probe 3: the pipelined prefill attention (attention.wgsl: next slice's loads issued
# before the current slice's products, the row maximum from 16 partial maxima, per-thread row-sum
# shares, four value chains) against the session-start kernel (kbench_old, kestrel_old): kbench's
# prefill attention table, the kernel and fixture tests, and pp512 on E2B and E4B.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 KESTREL_KERNELS=attention ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "attention_d|test result" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures 2>&1 | grep -E "test result|FAIL" | tee -a "$F"
for b in kbench_old kbench kbench_old kbench; do
  echo "== $b" | tee -a "$F"
  ./target/release/$b attention_d 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for b in kestrel_old kestrel kestrel_old kestrel; do
    echo "== $a $b" | tee -a "$F"
    ./target/release/$b bench --model /tmp/$a -p 512 -n 32 2>&1 | grep -E "pp512|GPU time of one|^\| attention_d" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
