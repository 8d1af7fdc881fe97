#!/usr/bin/env bash
# Session 7, probe 4: the residual norms fused into the next mat-vec (qmv_norm.wgsl): the kernel
# tests on the H200, then `kestrel bench -p 512 -n 128` on the three archs.
set -uo pipefail
. tools/device/env.sh
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | tail -13 | tee "$OUT/p4.txt"
for arch in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch" | tee -a "$OUT/p4.txt"
  ./target/release/kestrel bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a "$OUT/p4.txt"
  rm -rf /tmp/$arch
done
