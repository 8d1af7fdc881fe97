#!/usr/bin/env bash
# First look on the H200 device machine: does the wgpu backend run on NVIDIA Vulkan, and what do
# full-size synthetic E2B/E4B (4-bit) decode at? Run from the repo root with the release binary
# at target/release/kestrel and the Vulkan loader .debs in .gl/ (see PERF_NOTES.md).
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv
# Correctness on NVIDIA: fixture 'long' prompt, both forms (compared with the references afterwards).
LONG=$(python3 -c "import json;print(','.join(map(str,json.load(open('tests/fixtures/prompts.json'))[2]['ids'])))")
for form in hf mlx-4bit; do
  for m in tiny-e2b tiny-e4b; do
    $K generate --model tests/fixtures/$m/$form --prompt-ids $LONG --max-new 48 --ignore-eos --json > "$OUT/$m-$form.json" 2>>"$OUT/stderr.txt"
  done
done
# Full-size synthetic models: prefill of 512 tokens (pp512) and decode of 128 (tg128).
P512=$(python3 -c "print(','.join(str(2+i*37%1000) for i in range(512)))")
P16=$(python3 -c "print(','.join(str(2+i*37%1000) for i in range(16)))")
for arch in e2b e4b; do
  /usr/bin/time -v $K synth --arch $arch --quant 4bit /tmp/$arch 2>&1 | grep -E "wrote|Maximum resident" | tee -a "$OUT/summary.txt"
  for run in "pp512 $P512 1" "tg128 $P16 128"; do
    set -- $run
    $K generate --model /tmp/$arch --prompt-ids $2 --max-new $3 --ignore-eos --json 2>>"$OUT/stderr.txt" \
      | python3 -c "import json,sys; d=json.load(sys.stdin); print('$arch $1', json.dumps(d['stats']))" | tee -a "$OUT/summary.txt"
  done
  rm -rf /tmp/$arch
done
