#!/usr/bin/env bash
# Session 10, probe 6 (after the final call, which found load hoisting in attention_split and
# attention_combine slower: reverted): the code to commit — attention_split's key sums by
# subgroupAdd (default) vs the tree (KESTREL_ATTN_TREE=1) at a 512-token context on E2B and
# E4B, and 26B with the rank-based router_topk, `kestrel bench -p 512 -n 128` each.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p6.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests split_attention 2>&1 | grep -E "test result" | tee -a "$F"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for v in 0 1; do
    echo "== $a KESTREL_ATTN_TREE=$v" | tee -a "$F"
    KESTREL_ATTN_TREE=$v ./target/release/kestrel bench --model /tmp/$a -p 512 -n 128 > "$OUT/$a-tree$v.txt" 2>&1
    grep -E "pp512|tg128|decode step:|^\| attention_(split|combine)" "$OUT/$a-tree$v.txt" | tee -a "$F"
  done
  rm -rf /tmp/$a
done
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
echo "== 26b-a4b" | tee -a "$F"
./target/release/kestrel bench --model /tmp/26b-a4b -p 512 -n 128 > "$OUT/26b-a4b.txt" 2>&1
grep -E "pp512|tg128|decode step:|^\| attention_(split|combine)|^\| router" "$OUT/26b-a4b.txt" | tee -a "$F"
date -u | tee -a "$F"
