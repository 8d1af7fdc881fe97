#!/usr/bin/env bash
# Session 8, final: the norm weights read as vec4 in the fused-norm prologue, decode only,
# fused at every hidden size (KESTREL_FUSE_NORMS=all) vs unfused, per arch; then the
# BENCHMARKS.md run (`kestrel bench -p 512 -n 128`, E4B and 26B in both settings so that the
# table has the committed default whichever wins) and the transformers peer (eager) in the
# same call.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="$OUT/final.txt"
P="$OUT/probe.txt"
date -u | tee "$F" "$P"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
run() { ab_run "$P" "$@"; }
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  run $arch KESTREL_FUSE_NORMS=0
  run $arch KESTREL_FUSE_NORMS=all
  [ $arch = 26b-a4b ] && run $arch KESTREL_FUSE_NORMS=all KESTREL_QMV_TILES=8192x2816=16x4,9216x2816=16x4
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  if [ $arch != e2b ]; then
    echo "== $arch KESTREL_FUSE_NORMS=all" | tee -a "$F"
    KESTREL_FUSE_NORMS=all $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  fi
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
