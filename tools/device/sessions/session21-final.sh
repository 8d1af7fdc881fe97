#!/usr/bin/env bash
# Session 21, final call: final_checks (the kernel tests with the tensor-core ones — the new
# moe_norm test holds the one-dispatch close of a MoE block bitwise to its three dispatches on
# this GPU, and its residual form to rmsnorm mode 2 —, the fixtures end to end, the 256 MiB
# mat-vec); then per arch, the 26B first (a call cut short still brings its A/B back), the
# BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) and the transformers peer (eager); on the
# 26B after its default run the decode A/B of the MoE close (KESTREL_MOE_NORM 0 = four
# dispatches, 1 = three in one and the residual norm apart, 2 = the default, four in one, then
# 0 again: tg128, the step line, the MoE and norm rows of the per-dispatch profile). ≈ 8 min.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/final.txt"
final_checks "$F"
for arch in 26b-a4b e4b e2b; do
  date -u | tee -a "$F"
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, $K)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  if [ $arch = 26b-a4b ]; then
    for s in 0 1 2 0; do
      ab_bench "$F" $arch "-p 512 -n 128" "tg128|decode step:|^\| (moe_|rmsnorm)" KESTREL_MOE_NORM=$s
    done
  fi
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
