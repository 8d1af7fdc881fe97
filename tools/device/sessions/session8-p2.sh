#!/usr/bin/env bash
# Session 8, probe 2: the fused-norm qmv (prologue as committed) at every hidden size with
# tiles of more rows per workgroup (fewer redundant prologues: p1 said the prologue's cost
# follows the workgroup count), against unfused; and the prologue without its norm-weight loads
# (KESTREL_EXP_PRO_NOW=1, wrong output: what bf16 norm weights could buy at most).
# The knobs other than KESTREL_FUSE_NORMS and KESTREL_QMV_TILES are in
# tools/experiments/fused-norm-forms.patch: apply it and build before running this.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
run() { ab_run "$F" "$@"; }
declare -A T1 T2 T3
T1[e4b]="20480x2560=8x4,3072x2560=16x4,6144x2560=16x4,256x2560=16x2"
T2[e4b]="20480x2560=16x4,3072x2560=32x4,6144x2560=32x4,256x2560=32x2"
T3[e4b]="20480x2560=8x8,3072x2560=8x4,6144x2560=8x4,256x2560=16x1"
T1[26b-a4b]="8192x2816=16x4,9216x2816=16x4"
T2[26b-a4b]="8192x2816=8x4,9216x2816=8x4"
T3[26b-a4b]="8192x2816=16x8,9216x2816=16x8"
T1[e2b]="12288x1536=8x4,2560x1536=16x4,5120x1536=16x4,256x1536=16x2"
T2[e2b]="12288x1536=16x4,2560x1536=32x4,5120x1536=32x4,256x1536=32x2"
T3[e2b]="12288x1536=8x8,2560x1536=8x4,5120x1536=8x4,256x1536=16x1"
for arch in e4b 26b-a4b e2b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  run $arch KESTREL_FUSE_NORMS=0
  run $arch KESTREL_FUSE_NORMS=all
  run $arch KESTREL_FUSE_NORMS=all KESTREL_EXP_PRO_NOW=1
  run $arch KESTREL_FUSE_NORMS=all KESTREL_QMV_TILES=${T1[$arch]}
  run $arch KESTREL_FUSE_NORMS=all KESTREL_QMV_TILES=${T2[$arch]}
  run $arch KESTREL_FUSE_NORMS=all KESTREL_QMV_TILES=${T3[$arch]}
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
