#!/usr/bin/env bash
# Session 10, probe 4: decode attention_split with each key's lane partials added by subgroupAdd
# (one barrier) instead of a 6-level workgroup-memory tree, and G keys' K (then V) rows in flight
# (KESTREL_ATTN_G; 4 before); KESTREL_ATTN_TREE=1 is the old reduction. Decode-only bench, one
# binary; the split attention kernel test on the H200 at each G first.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
date -u | tee "$F"
for g in 4 8 16; do KESTREL_ATTN_G=$g KESTREL_REQUIRE_GPU=1 ./target/release/ktests split_attention 2>&1 | grep -E "test result" | sed "s/^/G=$g: /" | tee -a "$F"; done
for a in e2b e4b 26b-a4b; do ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1; done
att() {
  local arch=$1; shift
  echo "== $arch $*" | tee -a "$F"
  env "$@" ./target/release/kestrel bench --model /tmp/$arch -p 16 -n 128 2>&1 | grep -E "tg128|decode step:|^\| attention" | tee -a "$F"
}
for a in e2b e4b 26b-a4b; do
  att $a KESTREL_ATTN_TREE=1
  att $a KESTREL_ATTN_G=4
  att $a KESTREL_ATTN_G=8
  att $a KESTREL_ATTN_G=16
done
date -u | tee -a "$F"
