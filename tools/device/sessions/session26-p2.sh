#!/usr/bin/env bash
# Session 26, p2: attention_short (one dispatch per layer for decode rows of ≤ short_max keys)
# against attention_split + attention_combine. (1) the split-attention kernel test on the H200
# (every form against the CPU reference, the mixed verify program); (2) kbench's rows of the
# three kernels at 16–1025 keys; (3) decode A/B, one process each, alternating:
# KESTREL_ATTN_SHORT=0 (the split form only) against the default (256) on E2B, E4B and the 26B
# (-p 16 -n 128: tg at positions 1–128); (4) E4B at depth 512 (-d 512: positions 512–639)
# with 0, the default (every row past 256: the split form) and 1024 (every row short);
# (5) the fixtures on the H200. ≈ 8 min warm. Carry target/carry (--tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
echo "== ktests split_attention" | tee -a "$F"
timeout 120 ./target/release/ktests split_attention --nocapture 2>&1 | grep -E "short|test result|panicked|FAILED" | tail -8 | tee -a "$F"
echo "== kbench attention_short / split / combine rows ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES=none timeout 200 ./target/release/kbench attention_ 2>&1 | grep -E "^\| attention_(short|split|combine)" | tee -a "$F"
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    for s in 0 256; do ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT=$s; done
  done
  [ $a = e4b ] && for s in 0 256 1024; do ab_bench "$F" e4b "-p 16 -n 128 -d 512" "tg128|decode step:" KESTREL_ATTN_SHORT=$s; done
  rm -rf /tmp/$a
done
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
timeout 200 ./target/release/kfixtures 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
