#!/usr/bin/env bash
# Session 23, sixth call: how much of the 26B's decode step grows with the context (the f32 K/V
# read by its decode attention, PERF_NOTES.md session 23's next steps): `kestrel bench -n 128` at
# a 16-token prompt and at the table's 512, twice each: tg128, the step line and the attention
# rows of the per-dispatch profile. ≈ 4 min. Carry target/carry (pack.sh) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p6-context.txt"
date -u | tee "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
P="tg128|decode step:|^\| attention_|^\| qkv_norm_rope"
for p in 16 512 16 512; do
  ab_bench "$F" 26b-a4b "-p $p -n 128" "$P" CONTEXT=$p
done
date -u | tee -a "$F"
