#!/usr/bin/env bash
# Session 20, second table: the prompt tail cut one step earlier (at the last KV-owning layer's
# attention, so the 26B's last layer runs for one token too) and long prompts' earlier chunks
# reading back nothing. The fixtures end to end on the H200 first (the kernels are unchanged
# since session20-final.sh ran their tests); if one fails, the table runs with
# KESTREL_PROMPT_TAIL=0 and says so. Then per arch (E4B first) the BENCHMARKS.md run (`kestrel
# bench -p 512 -n 128`), the prefill A/B of KESTREL_PROMPT_TAIL=0 (-p 512 -n 8), the
# transformers peer (eager). ≈ 6.5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final2.txt}"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
TAIL=()
if grep -qE "FAILED|panicked|FAIL " "$F"; then
  echo "a test failed: the table below runs with KESTREL_PROMPT_TAIL=0" | tee -a "$F"
  TAIL=(KESTREL_PROMPT_TAIL=0)
fi
PAT="^\| (pp512|tg128) |GPU time of one 512"
for arch in e4b e2b 26b-a4b; do
  date -u | tee -a "$F"
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, $K ${TAIL[*]:-})" | tee -a "$F"
  env "${TAIL[@]}" $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  ab_bench "$F" $arch "-p 512 -n 8" "$PAT" KESTREL_PROMPT_TAIL=0
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
