#!/usr/bin/env bash
# Session 13, final: the kernel tests (with the ignored tensor-core one) and the fixtures end to
# end on the H200; kbench's 256 MiB mat-vec; then the BENCHMARKS.md run (`kestrel bench -p 512
# -n 128`) on the three archs with the transformers peer (eager) in the same call; and on E2B
# and E4B one more run with rmsnorm at 1024 threads (KESTREL_RMSNORM_WG, an A/B against the
# default run just before it). Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  if [ $arch != 26b-a4b ]; then
    ab_bench "$F" $arch "-p 512 -n 128" "^\| (pp512|tg128) |GPU time of one 512|decode step:|^\| rmsnorm" KESTREL_RMSNORM_WG=1024
  fi
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
