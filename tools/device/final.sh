#!/usr/bin/env bash
# The BENCHMARKS.md run on the H200: single-kernel benches, then `kestrel bench -p 512 -n 128`
# (text and --json) on synthetic E2B, E4B and 26B-A4B (all experts resident), and the
# transformers peer (tools/peer/hf_bench.py, bf16) in the same call. PEER_MODES picks the peer's
# modes per arch (default: eager; the compile mode takes ≈ 3 min of compilation per arch);
# KBENCH=0 skips the single-kernel benches and JSON=0 the --json bench runs (a run of the three
# archs with both off takes ≈ 4.5 min of device time).
# Needs target/release/kestrel, target/release/kbench (see kernels.sh) and .gl/ (PERF_NOTES.md).
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
date -u | tee "$OUT/final.txt"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$OUT/final.txt"
[ "${KBENCH:-1}" = 1 ] && ./target/release/kbench > "$OUT/kernels.txt" 2>&1
for arch in ${ARCHS:-e2b e4b 26b-a4b}; do
  echo "== $arch" | tee -a "$OUT/final.txt"
  $K synth --arch $arch --quant 4bit /tmp/$arch 2>&1 | tee -a "$OUT/final.txt"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$OUT/final.txt" 2>&1
  [ "${JSON:-1}" = 1 ] && $K bench --model /tmp/$arch -p 512 -n 128 --json > "$OUT/kestrel-$arch.json" 2>>"$OUT/final.txt"
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes ${PEER_MODES:-eager} --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$OUT/final.txt"
  rm -rf /tmp/$arch
done
