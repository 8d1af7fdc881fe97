#!/usr/bin/env bash
# kestrel bench on full-size synthetic models on the H200 (see PERF_NOTES.md). Needs the release
# binary at target/release/kestrel and the Vulkan loader .debs in .gl/.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
for arch in ${ARCHS:-e2b e4b}; do
  $K synth --arch $arch --quant 4bit /tmp/$arch 2>&1 | tee -a "$OUT/bench.txt"
  $K bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a "$OUT/bench.txt"
  $K bench --model /tmp/$arch -p 512 -n 128 --json > "$OUT/bench-$arch.json" 2>>"$OUT/bench.txt"
  rm -rf /tmp/$arch
done
