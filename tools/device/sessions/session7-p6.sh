#!/usr/bin/env bash
# Session 7, probe 6: the fused-norm qmv with its input stored conflict-free ([vec4 j][chunk]):
# the kernel tests on the H200, then per arch `kestrel bench -p 512 -n 128` (fused, the default
# 256-workgroup cap), and decode only (-p 128) with the norms unfused (KESTREL_FUSE_NORMS=0) and
# with a 528-workgroup cap, same binary.
set -uo pipefail
. tools/device/env.sh
date -u | tee "$OUT/p6.txt"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | grep -E "^test |test result" | tee -a "$OUT/p6.txt"
for arch in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch fused" | tee -a "$OUT/p6.txt"
  ./target/release/kestrel bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a "$OUT/p6.txt"
  for v in "KESTREL_FUSE_NORMS=0" "KESTREL_PRO_WGS=528"; do
    echo "== $arch $v" | tee -a "$OUT/p6.txt"
    env $v ./target/release/kestrel bench --model /tmp/$arch -p 128 -n 128 2>&1 | grep -E "tg128|decode step:|_norm|rmsnorm" | tee -a "$OUT/p6.txt"
  done
  rm -rf /tmp/$arch
done
