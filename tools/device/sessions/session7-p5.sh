#!/usr/bin/env bash
# Session 7, probe 5: the fused-norm qmv with its grid capped (KESTREL_PRO_WGS workgroups stride
# over the row blocks) against the norms as their own dispatches (KESTREL_FUSE_NORMS=0), same
# binary, `kestrel bench -p 128 -n 128` (decode figures; the prefill path is unchanged).
set -uo pipefail
. tools/device/env.sh
date -u | tee "$OUT/p5.txt"
for arch in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for v in "KESTREL_FUSE_NORMS=0" "KESTREL_PRO_WGS=132" "KESTREL_PRO_WGS=256" "KESTREL_PRO_WGS=528"; do
    echo "== $arch $v" | tee -a "$OUT/p5.txt"
    env $v ./target/release/kestrel bench --model /tmp/$arch -p 128 -n 128 2>&1 | grep -E "tg128|decode step:|norm|rmsnorm" | tee -a "$OUT/p5.txt"
  done
  rm -rf /tmp/$arch
done
