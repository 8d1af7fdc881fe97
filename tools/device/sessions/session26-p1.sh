#!/usr/bin/env bash
# Session 26, p1: session25-p3.sh (the gate-only fused-norm default against the width rule and
# gate + GeGLU, alternating on E4B), then kbench's decode-attention latency rows (split +
# combine at 131 / 1025 / 4097 keys, one split at 32 / 131 / 256) as the baseline for a
# one-pass short-context attention. ≈ 3.5 min warm. Carry target/carry (--tests) and .gl.
set -uo pipefail
bash tools/device/sessions/session25-p3.sh
. tools/device/env.sh
F="$OUT/p1-attn.txt"
for k in attention_split attention_combine; do
  echo "== kbench latency rows of $k ($(date -u +%T))" | tee -a "$F"
  KBENCH_SHAPES=none timeout 200 ./target/release/kbench $k 2>&1 | sed -n '/decode kernel (dependent chain)/,/^$/p' | tee -a "$F"
done
