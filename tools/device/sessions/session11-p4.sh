#!/usr/bin/env bash
# Session 11, probe 4: the staged decode mat-vec on packed integer dot products (qmv_core.wgsl
# dot32i / stage_chunk) against the session-start binaries (kbench_old, kestrel_old): kernel and
# fixture tests, kbench's mat-vec rows (weights from memory) and the lanes × rows sweep on the
# 256 MiB matrix, and decode (tg128, 16-token prompt) on E2B, E4B and 26B-A4B.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 KESTREL_KERNELS=qmv ./target/release/ktests every_kernel qmv_rows qmv_staged --nocapture 2>&1 | grep -E "^qmv_q4_t[14]_l(8|16|32)|test result|FAIL" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures 2>&1 | grep -E "test result|FAIL" | tee -a "$F"
export KBENCH_SHAPES="256 MiB,E2B gate|up,E4B gate|up,E2B LM head,E4B LM head"
for b in kbench_old kbench kbench_old kbench; do
  echo "== $b" | tee -a "$F"
  ./target/release/$b qmv_q4_t 2>&1 | grep -E "copy roofline|^\| [0-9E]" | tee -a "$F"
done
echo "== sweep 256 MiB (new)" | tee -a "$F"
KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t1 --sweep 2>&1 | grep -E "^\| [0-9E]" | tee -a "$F"
unset KBENCH_SHAPES
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for b in kestrel_old kestrel kestrel_old kestrel; do
    echo "== $a $b" | tee -a "$F"
    ./target/release/$b bench --model /tmp/$a -p 16 -n 128 2>&1 | grep -E "tg128|decode step:|^\| qmv_(glu_)?q4_t1_l(8|16|32)" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
