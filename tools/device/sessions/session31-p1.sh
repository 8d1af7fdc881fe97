#!/usr/bin/env bash
# Session 31, p1 (ready at the end of session 30, which had no device time left for it): the
# decode norms at 512 threads in the step. Session 18 #6 moved decode and verify norms from 256
# to 1024 threads (E4B +0.5 %, 26B +1.6 %) but never ran 512; session 30 #6 found attention_short
# faster in the step at 512 threads than at 1024 (E2B / E4B +0.6 %) while the pass time did not
# fall. Decode A/B, one process each, alternating KESTREL_RMSNORM_WG=1024 (the default where the
# device allows) / 512 (-p 16 -n 128), two rounds, on E4B (129 standalone norms a step), the 26B
# (62) and E2B (4: the control, its norms are fused), then the split-attention and norm kernel
# tests and the fixtures at 512. ≈ 5 min warm. Then `bash tools/device/sessions/session30-final.sh` (the
# table at session 30's defaults: group-0 sum, 512-thread attention_short). Carry target/carry
# (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
for a in e4b 26b-a4b e2b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_RMSNORM_WG=1024
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_RMSNORM_WG=512
  done
  rm -rf /tmp/$a
done
echo "== ktests every_kernel KESTREL_KERNELS=rmsnorm KESTREL_RMSNORM_WG=512" | tee -a "$F"
KESTREL_RMSNORM_WG=512 KESTREL_KERNELS=rmsnorm KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests every_kernel 2>&1 | grep -E "FAIL|test result|panicked" | tee -a "$F"
echo "== kfixtures KESTREL_RMSNORM_WG=512 ($(date -u +%T))" | tee -a "$F"
KESTREL_RMSNORM_WG=512 KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
