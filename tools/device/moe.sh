#!/usr/bin/env bash
# Issue 3 at full size on the H200: synthesise a 26B-A4B-shaped 4-bit checkpoint, install it
# (bounded memory), then bench decode with 8/16/32 expert slots per layer and all experts
# resident, recording peak RSS (the bench's own VmHWM) and GPU memory (nvidia-smi, sampled).
# Needs target/release/kestrel and the Vulkan loader .debs in .gl/ (see PERF_NOTES.md).
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
L="$OUT/moe.txt"
{ date; df -h /tmp; free -g; nproc; } >> "$L"
/usr/bin/time -f "synth: %e s, max RSS %M KB" $K synth --arch 26b-a4b --quant 4bit /tmp/src >> "$L" 2>&1
du -sh /tmp/src >> "$L"
/usr/bin/time -f "install: %e s, max RSS %M KB" $K install /tmp/src /tmp/inst --json >> "$L" 2>&1
du -sh /tmp/inst /tmp/inst/experts >> "$L"
rm -rf /tmp/src
gpumem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$1" 2>/dev/null & echo $!; }
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
echo "gpu memory used before runs: ${base} MiB" >> "$L"
for s in 16 8 32 all; do
  trust=--trust-manifest; [ "$s" = 16 ] && trust=
  pid=$(gpumem "$OUT/gpumem-$s.txt")
  echo "== --expert-slots $s $trust" >> "$L"
  timeout 150 /usr/bin/time -f "bench slots=$s: %e s, max RSS %M KB" $K bench --model /tmp/inst --expert-slots $s $trust -p 128 -n 64 >> "$L" 2>&1
  kill $pid 2>/dev/null; sleep 0.3
  echo "gpu memory peak (slots=$s): $(sort -n "$OUT/gpumem-$s.txt" | tail -1) MiB" >> "$L"
done
