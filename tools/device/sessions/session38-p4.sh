#!/usr/bin/env bash
# Session 38, p4: p3's change without the widened fused-norm verify tile (it lost in p3): verify
# steps run the plain, GeGLU and gated 4-bit mat-vecs on the token tile of their size (M = 2, 3)
# and the fused-norm ones on 2-token tiles as before. kestrel_base (a24eb5e's code) against
# kestrel, alternating, two rounds, E2B and E4B: tg128, step and verify rows; then the
# speculative tests on this GPU. Carry target/carry/kestrel.gz, kestrel_base.gz, kspec.gz and
# .gl. ≈ 2.5 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$F"
P="tg128|decode step:|^\| [1-5] \|"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    BIN=kestrel_base ab_bench "$F" $a "-p 16 -n 128" "$P"
    ab_bench "$F" $a "-p 16 -n 128" "$P"
  done
  rm -rf /tmp/$a
done
echo "== speculative tests ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kspec wgpu 2>&1 | grep -E "^test |test result|panicked|differs|bitwise" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
