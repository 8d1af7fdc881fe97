#!/usr/bin/env bash
# Session 12, call 2: qmm_coop with one accumulator per output block (the low halves' two
# products summed per 16-deep step into a transient block and added to the high one, 8 f32
# blocks live per subgroup instead of 16) against session 9's two (KESTREL_QMM_COOP_ACC=2):
# the tensor-core test (both forms), kbench's 128 × 128 rows, the fixtures, and pp512 on E4B and
# E2B with each form (two runs each). Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/qmm-coop-acc.txt"
date -u | tee "$F"
for acc in 1 2; do
  echo "== KESTREL_QMM_COOP_ACC=$acc" | tee -a "$F"
  KESTREL_QMM_COOP_ACC=$acc KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm_coop --nocapture > /tmp/t.txt 2>&1
  grep -E "test result|FAIL|panicked" /tmp/t.txt | tee -a "$F"
  grep -oE "NMSE [0-9.e+-]+" /tmp/t.txt | awk '{n++; if ($2 + 0 > m) m = $2 + 0} END {print n " cases, max NMSE " m}' | tee -a "$F"
  KESTREL_QMM_COOP_ACC=$acc ./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ" | tee -a "$F"
for a in e4b e2b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for acc in 1 2 1 2; do
    echo "== $a KESTREL_QMM_COOP_ACC=$acc" | tee -a "$F"
    KESTREL_QMM_COOP_ACC=$acc ./target/release/kestrel bench --model /tmp/$a -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| qmm_" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
