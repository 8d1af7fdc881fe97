#!/usr/bin/env bash
# Planned first call of session 12 (PERF_NOTES.md, session 11, next steps 0–1): the register-tiled
# prefill attention against the default (tools/device/attention-tiled.sh), then the stacked GeGLU
# decode mat-vec at 8 lanes × 2 pairs against the rule's 16 × 1 on E4B and E2B (decode only).
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
# Ran in session 12 at 8fd03b4 (benches/results/2026-12-01-h200-session12-p1-*).
set -uo pipefail
bash tools/device/attention-tiled.sh
. tools/device/env.sh
F="$OUT/glu-tiles.txt"
for a in e4b e2b; do ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1; done
for v in X=0 KESTREL_QMV_TILES=20480x2560=8x4 X=0 KESTREL_QMV_TILES=20480x2560=8x4; do ab_run "$F" e4b $v; done
for v in X=0 KESTREL_QMV_TILES=12288x1536=8x4 X=0 KESTREL_QMV_TILES=12288x1536=8x4; do ab_run "$F" e2b $v; done
