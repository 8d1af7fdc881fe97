#!/usr/bin/env bash
# Session 8, probe 3: E4B decode with the norms fused into one kind of consumer at a time
# (KESTREL_FUSE_ONLY: q|k|v = qmv, gate|up = glu, per-layer gate = gb): the final run said
# fusing into all three loses at hidden 2560 (207.3 → 198.2); does any one of them win?
# The knobs other than KESTREL_FUSE_NORMS and KESTREL_QMV_TILES are in
# tools/experiments/fused-norm-forms.patch: apply it and build before running this.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
run() { ab_run "$F" "$@"; }
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
run e4b KESTREL_FUSE_NORMS=0
for k in qmv glu gb glu,gb; do run e4b KESTREL_FUSE_NORMS=all KESTREL_FUSE_ONLY=$k; done
run e4b KESTREL_FUSE_NORMS=0
date -u | tee -a "$F"
