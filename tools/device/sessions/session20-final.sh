#!/usr/bin/env bash
# Session 20, final: the kernel tests (with the ignored tensor-core ones) and the fixtures end to
# end on the H200 — among them the new prompt-tail test (a prompt's KV-sharing layers run for its
# last token alone, WgpuOptions::prompt_tail) — and kbench's 256 MiB mat-vec. If a fixture test
# fails, the table is made with KESTREL_PROMPT_TAIL=0 and says so. Then per arch (E4B first) the
# BENCHMARKS.md run (`kestrel bench -p 512 -n 128`), the prefill A/B of one binary (-p 512 -n 8,
# KESTREL_PROMPT_TAIL=0: every layer for every token; E2B and E4B, the models with KV-sharing
# layers), the transformers peer (eager); then E4B's A/B once more. ≈ 8 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
TAIL=()
if grep -qE "FAILED|panicked|FAIL " "$F"; then
  echo "a test failed: the table below runs with KESTREL_PROMPT_TAIL=0" | tee -a "$F"
  TAIL=(KESTREL_PROMPT_TAIL=0)
fi
PAT="^\| (pp512|tg128) |GPU time of one 512|^\| qmm_coop|^\| qmv_q4_t1_l8_r4"
for arch in e4b e2b 26b-a4b; do
  date -u | tee -a "$F"
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, $K ${TAIL[*]:-})" | tee -a "$F"
  env "${TAIL[@]}" $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  [ $arch = 26b-a4b ] || ab_bench "$F" $arch "-p 512 -n 8" "$PAT" KESTREL_PROMPT_TAIL=0
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  [ $arch = e4b ] || rm -rf /tmp/$arch
done
date -u | tee -a "$F"
for v in KESTREL_PROMPT_TAIL=1 KESTREL_PROMPT_TAIL=0 KESTREL_PROMPT_TAIL=1; do ab_bench "$F" e4b "-p 512 -n 8" "$PAT" $v; done
rm -rf /tmp/e4b
date -u | tee -a "$F"
