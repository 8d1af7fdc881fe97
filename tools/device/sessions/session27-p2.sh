#!/usr/bin/env bash
# Session 27, p2: p1's attention_short lost (E2B 379.1 → 343.6 tok/s, kbench 7.4 → 13.0 µs at 16
# keys). Which part: KESTREL_ATTN_SHORT_HOIST=0 (no loads before the query: p1's barrier
# changes alone), 1 (the first K batch before it), against session 26's binary (kestrel-old).
# kbench's attention_short rows per form, then decode A/B alternating on E2B and E4B
# (-p 16 -n 128). ≈ 5 min warm. Carry target/carry (--tests, plus kestrel-old.gz) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
for h in 0 1; do
  echo "== ktests split_attention / kbench attention_short KESTREL_ATTN_SHORT_HOIST=$h ($(date -u +%T))" | tee -a "$F"
  KESTREL_ATTN_SHORT_HOIST=$h timeout 60 ./target/release/ktests split_attention 2>&1 | grep -E "test result|panicked" | tee -a "$F"
  KESTREL_ATTN_SHORT_HOIST=$h KBENCH_SHAPES=none timeout 100 ./target/release/kbench attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
done
ab_bin() {
  local arch=$1 bin=$2; shift 2
  echo "== $arch $bin $*" | tee -a "$F"
  env "$@" ./target/release/$bin bench --model /tmp/$arch -p 16 -n 128 2>&1 | grep -E "tg128|decode step:" | tee -a "$F"
}
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bin $a kestrel-old
    ab_bin $a kestrel KESTREL_ATTN_SHORT_HOIST=0
    ab_bin $a kestrel KESTREL_ATTN_SHORT_HOIST=1
  done
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
