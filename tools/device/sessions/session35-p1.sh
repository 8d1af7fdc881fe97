#!/usr/bin/env bash
# Session 35, p1: BENCHMARKS.md's table at eeb047e's defaults (session 34's digits; no H200 came
# in session 34) — the fixtures and the 256 MiB mat-vec (KTESTS=0: session 34's table ran the
# kernel tests with these kernels), then `kestrel bench -p 512 -n 128` and the transformers peer
# per model — and, on the 26B's model in the same call, every residual norm fused into its
# consumer now that the fused loop runs on digits (KESTREL_FUSE_NORMS=all; session 25 #3 lost
# 255.8 → 244.3 on the float loop): all / defaults / all, one process each. ≈ 8.5 min warm.
# Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
fuse_ab() {
  [ "$2" = 26b-a4b ] || return 0
  for s in KESTREL_FUSE_NORMS=all KESTREL_DEFAULTS=1 KESTREL_FUSE_NORMS=all; do
    ab_bench "$1" "$2" "-p 16 -n 128" "tg128|decode step:|^\| rmsnorm" $s
  done
}
KTESTS=0 final_checks "$F"
for arch in 26b-a4b e4b e2b; do
  TABLE_AB=fuse_ab table_row "$F" $arch
done
echo "== end ($(date -u +%T))" | tee -a "$F"
