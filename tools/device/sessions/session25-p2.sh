#!/usr/bin/env bash
# Session 25, p2: p1 measured the E4B step's 129 residual norms at 803 µs (KESTREL_SKIP) and
# the attention (split + combine) at 17 µs per layer on every model. Here, with the code of
# today (32-lane mat-vec teams; sessions 7-8 measured the fused norms with older mat-vecs):
# the norms fused into their consumers at every hidden size (KESTREL_FUSE_NORMS=all), and only
# into decode grids of at most 400 / 64 workgroups (KESTREL_FUSE_NORMS_MAX_WG); the decode
# attention's key splits (32 default; 16, 8) and keys in flight (4 default; 2, 8).
# -p 16 -n 128, one process per setting, same binary. ≈ 6 min warm. Carry target/carry and .gl.
# KESTREL_FUSE_NORMS_MAX_WG was an experiment knob, replaced by the kind rule it led to
# (kernels::fuse_norm_into); tools/experiments/fuse-norms-max-wg.patch restores it (on 4c6c6e7).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
P="tg128|decode step:|over [0-9]+ dispatches|^\| (rmsnorm|attention|qmv_[a-z_0-9]*norm)"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for s in "" all "all 400" "all 64" "" ; do
  set -- $s
  ab_bench "$F" e4b "-p 16 -n 128" "$P" KESTREL_FUSE_NORMS=${1:-} KESTREL_FUSE_NORMS_MAX_WG=${2:-}
done
for v in "KESTREL_ATTN_SPLITS=16" "KESTREL_ATTN_SPLITS=8" "KESTREL_ATTN_G=2" "KESTREL_ATTN_G=8"; do
  ab_bench "$F" e4b "-p 16 -n 128" "$P" $v
done
rm -rf /tmp/e4b
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for s in "" all "all 400" ""; do
  set -- $s
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_FUSE_NORMS=${1:-} KESTREL_FUSE_NORMS_MAX_WG=${2:-}
done
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ATTN_SPLITS=8
rm -rf /tmp/26b-a4b
./target/release/kestrel synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1
for v in "KESTREL_ATTN_SPLITS=32" "KESTREL_ATTN_SPLITS=8" "KESTREL_ATTN_SPLITS=16"; do
  ab_bench "$F" e2b "-p 16 -n 128" "$P" $v
done
echo "== end ($(date -u +%T))" | tee -a "$F"
