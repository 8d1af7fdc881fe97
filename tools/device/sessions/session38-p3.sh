#!/usr/bin/env bash
# Session 38, p3: verify steps on token tiles of their own size (Variant::tile: a verify of
# M = 2 or 3 tokens runs the 4-bit mat-vecs' 2- or 3-token tile instead of the 4-token one with
# the missing tokens clamped), and the fused-norm mat-vecs' verify tile widened from 2 tokens to
# the widest that fits (pro_verify_form: 4 on this GPU at E2B's and E4B's widths).
# kestrel_base (a24eb5e's code) against kestrel (the change), alternating, two rounds, E2B and
# E4B: `kestrel bench -p 16 -n 128`'s tg128, step and verify rows. Then on this GPU the kernel
# tests of the tiles (rows bitwise across tiles 1–4; every kernel against the CPU reference) and
# the speculative tests (verify rows bitwise decode's at M = 2, 3, 5).
# Carry target/carry/kestrel.gz, kestrel_base.gz, ktests.gz, kspec.gz and .gl. ≈ 5 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
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
echo "== kernel tests: token tiles, every kernel ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests token_tiles every_kernel 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== speculative tests ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kspec wgpu 2>&1 | grep -E "^test |test result|panicked|differs|bitwise" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
