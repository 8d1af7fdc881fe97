#!/usr/bin/env bash
# First look on the H200 device machine: does the wgpu backend run on NVIDIA Vulkan, and what do
# full-size synthetic E2B/E4B (4-bit) decode at? Run from the repo root with the release binary
# at target/release/kestrel and the Vulkan loader .debs in .gl/ (see PERF_NOTES.md).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan
K=./target/release/kestrel
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv
# Correctness on NVIDIA: fixture 'long' prompt, both forms (compared with the references afterwards).
LONG=$(python3 -c "import json;print(','.join(map(str,json.load(open('tests/fixtures/prompts.json'))[2]['ids'])))")
for form in hf mlx-4bit; do
  for m in tiny-e2b tiny-e4b; do
    $K generate --model tests/fixtures/$m/$form --prompt-ids $LONG --max-new 48 --ignore-eos --json > "$OUT/$m-$form.json" 2>>"$OUT/stderr.txt"
  done
done
# Full-size synthetic models.
P=$(python3 -c "print(','.join(str(2+i*37%1000) for i in range(512)))")
for arch in e2b e4b; do
  /usr/bin/time -v $K synth --arch $arch --quant 4bit /tmp/$arch 2>&1 | grep -E "wrote|Maximum resident|Elapsed" | tee -a "$OUT/summary.txt"
  $K generate --model /tmp/$arch --prompt-ids ${P:0:400} --max-new 128 --ignore-eos --json 2>>"$OUT/summary.txt" | python3 -c "import json,sys; d=json.load(sys.stdin); print('$arch', json.dumps(d['stats']))" | tee -a "$OUT/summary.txt"
  $K generate --model /tmp/$arch --prompt-ids $P --max-new 16 --ignore-eos --json 2>>"$OUT/summary.txt" | python3 -c "import json,sys; d=json.load(sys.stdin); print('$arch pp512', json.dumps(d['stats']))" | tee -a "$OUT/summary.txt"
  rm -rf /tmp/$arch
done
