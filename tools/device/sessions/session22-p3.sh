#!/usr/bin/env bash
# Session 22, second call: the routed experts' decode tiles on the 26B, now that the dense
# branch runs beside them (the rule for them, qmv_tile, was never swept in the step). One
# binary; KESTREL_QMV_TILES names a tile for one shape (routed experts: rows × top_k): the
# experts' GeGLU mat-vec 11264 × 2816 (default 64 lanes × 4 rows per team, i.e. 2 pairs) and
# their down projection 22528 × 704 (default 16 × 4). `kestrel bench -p 512 -n 128`, one
# process per setting, the default first and last: tg128, the step line and the routed rows
# of the per-dispatch profile. ≈ 5 min. Carry target/carry (tools/device/pack.sh) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3-moe-tiles.txt"
date -u | tee "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
P="tg128|decode step:|^\| qmv_(moe|glu)"
for t in default 11264x2816=32x4 11264x2816=16x4 11264x2816=128x4 11264x2816=64x8 \
         22528x704=32x4 22528x704=8x4 22528x704=16x8 22528x704=16x2 default; do
  ab_bench "$F" 26b-a4b "-p 512 -n 128" "$P" KESTREL_QMV_TILES=$t
done
date -u | tee -a "$F"
