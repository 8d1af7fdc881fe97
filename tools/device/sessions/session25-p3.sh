#!/usr/bin/env bash
# Session 25, p3: the final call's A/B put the kind rule (norms fused past 2048 into the gated
# per-layer gate and the GeGLU) at +0.9 % on E4B, not p2's +7 % sum of one-kind deltas; p2's best
# single form was the gate alone (235.7). Here, alternating, one process each: the width rule
# (KESTREL_FUSE_NORMS=hidden), the gate alone (the new default), gate + GeGLU (=glu).
# E4B -p 16 -n 128. ≈ 2.5 min warm. Carry target/carry (kestrel only) and .gl.
# Run in session 26 (p1, benches/results/2026-12-03-h200-session26-p3.txt).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
date -u | tee "$F"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for r in 1 2; do
  for s in hidden "" glu; do ab_bench "$F" e4b "-p 16 -n 128" "tg128|decode step:" KESTREL_FUSE_NORMS=$s; done
done
echo "== end ($(date -u +%T))" | tee -a "$F"
