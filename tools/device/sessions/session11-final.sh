#!/usr/bin/env bash
# Session 11, final: the kernel tests (with the ignored tensor-core one) and the fixtures end to
# end on the H200; kbench's 256 MiB mat-vec with the long-row rule; then the BENCHMARKS.md run
# (`kestrel bench -p 512 -n 128`) on the three archs with the transformers peer (eager) in the
# same call. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs (incl. the ignored qmm_coop test)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== kbench 256 MiB" | tee -a "$F"
KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t 2>&1 | grep -E "copy roofline|^\| 256" | tee -a "$F"
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
