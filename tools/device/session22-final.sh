#!/usr/bin/env bash
# Session 22, final call: the fixtures end to end, the 256 MiB mat-vec and tests/experts.rs's
# overlap test on this GPU; then per arch, the 26B first (a call cut short still brings its row back), the BENCHMARKS.md
# run (`kestrel bench -p 512 -n 128`) and the transformers peer (eager). The overlap's A/B is in
# session22-p2.sh's and -p4.sh's output (device starts were refused before this call, so it was
# trimmed to fit the budget left). ≈ 5.5 min. Carry target/carry (tools/device/pack.sh
# --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/final.txt"
# final_checks without the kernel tests (they ran in p2 and p4 with these kernels: 18/18 and the
# routed GeGLU's), to fit the device time that three refused starts left.
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== kbench 256 MiB" | tee -a "$F"
KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t 2>&1 | grep -E "copy roofline|^\| 256" | tee -a "$F"
echo "== tests/experts.rs overlap" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kexperts wgpu_moe_overlap 2>&1 | grep -E "test result|panicked|differ" | tee -a "$F"
for arch in 26b-a4b e4b e2b; do
  date -u | tee -a "$F"
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, $K)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
