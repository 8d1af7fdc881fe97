#!/usr/bin/env bash
# The peer's static cache + torch.compile mode (the second peer mode; last run in session
# 3, E2B only: 186 s of compilation, decode slower than eager as CUDA graphs were re-recorded for
# 9 input sizes), on E2B and E4B, tg at a one-token context (as kestrel bench's tg128). Needs
# nothing but the kestrel binary (synth) and the machine's torch/transformers. ≈ 8–10 min.
# Carry target/carry (tools/device/pack.sh) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/peer-compile.txt"
date -u | tee "$F"
for a in e2b e4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  echo "== $a" | tee -a "$F"
  python3 tools/peer/hf_bench.py --config /tmp/$a/config.json -p 512 -n 128 --modes compile --tg-ctx 1 --json "$OUT/peer-compile-$a.json" 2>&1 | grep -vE "^\s*$" | tail -8 | tee -a "$F"
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
