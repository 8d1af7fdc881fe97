#!/usr/bin/env bash
# Session 21, second call: the split attention's merge form (attention_merge.wgsl: the last split
# workgroup of each (token, head) merges, no attention_combine dispatch; WgpuOptions::
# merge_attention, KESTREL_ATTN_MERGE=0 the A/B). final_checks first (the kernel tests: the
# split-attention test holds the merge form bitwise to attention_combine on this GPU; the
# fixtures end to end), then per arch the decode A/B at the table's context (`kestrel bench -p
# 512 -n 128`, merge 1, 0, 1, 0 in one binary): tg128, the step's pass-timestamp line and the
# attention rows of the per-dispatch profile. ≈ 7 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2-attention-merge.txt"
final_checks "$F"
for a in e4b e2b 26b-a4b; do
  date -u | tee -a "$F"
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 1 0 1 0; do
    ab_bench "$F" $a "-p 512 -n 128" "tg128|decode step:|^\| attention_" KESTREL_ATTN_MERGE=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
