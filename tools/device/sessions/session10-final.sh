#!/usr/bin/env bash
# Session 10, final: the kernel tests (with the ignored tensor-core one) and the fixtures end to
# end on the H200, then the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) on the three archs
# with the transformers peer (eager) in the same call, and each arch's decode with the binary
# of the session's start (target/release/kestrel_old: decode attention, its combine and the
# MoE router as they were) for the A/B. Carry target/carry (tools/device/pack.sh --tests, plus kestrel_old.gz)
# and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs (incl. the ignored qmm_coop test)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  echo "== $arch (session start binary: decode A/B)" | tee -a "$F"
  ./target/release/kestrel_old bench --model /tmp/$arch -p 512 -n 128 2>&1 | grep -E "pp512|tg128|decode step:|GPU time of one 512|^\| attention_(split|combine)|^\| router_topk" | tee -a "$F"
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
