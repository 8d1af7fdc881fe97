#!/usr/bin/env bash
# Session 7, probe 7: the fused-norm qmv (p6's binary) with the grid not capped
# (KESTREL_PRO_WGS past every matrix's block count: one workgroup per block, as unfused) and
# capped at 1056 (8 per SM), decode only.
set -uo pipefail
. tools/device/env.sh
date -u | tee "$OUT/p7.txt"
for arch in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for v in "KESTREL_PRO_WGS=1000000" "KESTREL_PRO_WGS=1056"; do
    echo "== $arch $v" | tee -a "$OUT/p7.txt"
    env $v ./target/release/kestrel bench --model /tmp/$arch -p 16 -n 128 2>&1 | grep -E "tg128|decode step:|_norm" | tee -a "$OUT/p7.txt"
  done
  rm -rf /tmp/$arch
done
