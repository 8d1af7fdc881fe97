#!/usr/bin/env bash
# Session 9, final: the tensor-core prefill kernels (qmm_coop, qmm_coop_moe) checked on the H200
# (their kernel tests, ignored where there are no cooperative matrices, and the fixtures end to
# end), then the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) on the three archs with the
# transformers peer (eager) in the same call, and 26B's pp512 without the tensor cores
# (KESTREL_QMM_COOP=0) for the A/B. Carry target/carry (tools/device/pack.sh --tests) and .gl.
# KBENCH_FILTER=F adds kbench's rows of kernels matching F (E4B shapes) after the tests; F=FILE
# names the output.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs qmm (incl. the ignored qmm_coop test)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored qmm 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu (prefill through the tensor-core kernels)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|prompt 0 \(chunk 128\)" | tee -a "$F"
if [ -n "${KBENCH_FILTER:-}" ]; then
  echo "== kbench $KBENCH_FILTER (E4B rows)" | tee -a "$F"
  ./target/release/kbench "$KBENCH_FILTER" 2>&1 | grep -E "^\| E4B" | tee -a "$F"
fi
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  if [ $arch = 26b-a4b ]; then
    echo "== $arch KESTREL_QMM_COOP=0" | tee -a "$F"
    KESTREL_QMM_COOP=0 $K bench --model /tmp/$arch -p 512 -n 16 2>&1 | grep -E "pp512|GPU time of one 512|^\| qmm" | tee -a "$F"
  fi
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
