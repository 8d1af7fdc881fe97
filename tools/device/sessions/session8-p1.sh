#!/usr/bin/env bash
# Session 8, probe 1: why the fused-norm qmv loses at hidden 2560/2816. Same binary, decode
# only, per-kernel times: unfused vs fused at every size (KESTREL_FUSE_NORMS=all) with the
# prologue as committed, in three passes (KESTREL_PRO_LEAN=1: fewer registers live), with the
# fused loop staging x from workgroup memory (KESTREL_PRO_STAGE=1), and with tiles of more
# rows per workgroup (fewer prologues: KESTREL_QMV_TILES).
# The knobs other than KESTREL_FUSE_NORMS and KESTREL_QMV_TILES are in
# tools/experiments/fused-norm-forms.patch: apply it and build before running this.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
run() { ab_run "$F" "$@"; }
TA="8192x2816=32x4,9216x2816=32x4,20480x2560=16x4,3072x2560=32x4,6144x2560=32x4"
TB="8192x2816=16x4,9216x2816=16x4,20480x2560=8x4,3072x2560=16x4,6144x2560=16x4"
for arch in e4b 26b-a4b e2b; do
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  run $arch KESTREL_FUSE_NORMS=0
  run $arch KESTREL_FUSE_NORMS=all
  run $arch KESTREL_FUSE_NORMS=all KESTREL_PRO_LEAN=1
  run $arch KESTREL_FUSE_NORMS=all KESTREL_PRO_STAGE=1
  run $arch KESTREL_FUSE_NORMS=all KESTREL_PRO_LEAN=1 KESTREL_PRO_STAGE=1
  if [ $arch != e2b ]; then
    run $arch KESTREL_FUSE_NORMS=all KESTREL_PRO_LEAN=1 KESTREL_QMV_TILES=$TA
    run $arch KESTREL_FUSE_NORMS=all KESTREL_PRO_LEAN=1 KESTREL_QMV_TILES=$TB
    run $arch KESTREL_FUSE_NORMS=0 KESTREL_QMV_TILES=$TA
  fi
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
