#!/usr/bin/env bash
# Session 7, probe 2: the two-pass argmax and the LM head at 8 × 4 (this commit) against the
# previous LM head tile and the sweep's best tiles for q|k|v and gate|up, end to end
# (KESTREL_QMV_TILES overrides, `kestrel bench -p 512 -n 128`).
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
date -u | tee "$OUT/p2.txt"
declare -A V
V[e2b]="base: oldlm:262144x1536=8x2 v1:2560x1536=64x2,12288x1536=8x2"
V[e4b]="base: oldlm:262144x2560=8x2 v1:3072x2560=32x2,20480x2560=16x4"
V[26b-a4b]="base: oldlm:262144x2816=8x2"
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for v in ${V[$arch]}; do
    echo "== $arch ${v%%:*} KESTREL_QMV_TILES=${v#*:}" | tee -a "$OUT/p2.txt"
    KESTREL_QMV_TILES="${v#*:}" $K bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a "$OUT/p2.txt"
  done
  rm -rf /tmp/$arch
done
