#!/usr/bin/env bash
# Session 26, p3: attention_short's shape. kbench's short rows (16-1025 keys, d 256 and 512)
# at workgroups of 1024 / 512 threads, keys per team in flight G 2 / 3 / 4 and value rows in
# flight GV 4 / 8; then the step on E4B and E2B (-p 16 -n 128), alternating, for the default
# (1024, 2, 4) and the two forms the rows favour (set below after reading nothing: G=3 GV=8,
# and WG=512 G=4 GV=8). ≈ 5 min warm. Carry target/carry (--tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
for cfg in "" "KESTREL_ATTN_SHORT_G=3" "KESTREL_ATTN_SHORT_G=4" "KESTREL_ATTN_SHORT_GV=8" "KESTREL_ATTN_SHORT_G=3 KESTREL_ATTN_SHORT_GV=8" \
           "KESTREL_ATTN_SHORT_WG=512" "KESTREL_ATTN_SHORT_WG=512 KESTREL_ATTN_SHORT_G=4 KESTREL_ATTN_SHORT_GV=8"; do
  echo "== kbench attention_short $cfg" | tee -a "$F"
  env $cfg KBENCH_SHAPES=none timeout 100 ./target/release/kbench attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
done
for a in e4b e2b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:"
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_G=3 KESTREL_ATTN_SHORT_GV=8
    ab_bench "$F" $a "-p 16 -n 128" "tg128|decode step:" KESTREL_ATTN_SHORT_WG=512 KESTREL_ATTN_SHORT_G=4 KESTREL_ATTN_SHORT_GV=8
  done
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
