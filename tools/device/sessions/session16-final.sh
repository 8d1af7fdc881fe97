#!/usr/bin/env bash
# Session 16, final: the kernel tests (with the ignored tensor-core ones) and the fixtures end
# to end on the H200, stopping there if any fails; kbench's 256 MiB mat-vec; then per arch the
# session's base binary (e71c24b, carried as target/carry/kestrel_base.gz: group_sum for every
# tensor-core mat-mat input) with `-p 512 -n 128` (prefill and the decode step's host
# recording, session 15's open question, both binaries over 128 steps), and the BENCHMARKS.md
# run (`kestrel bench -p 512 -n 128`) with the transformers peer (eager) in the same call.
# ≈ 8 min. Carry target/carry (tools/device/pack.sh --tests, then the base binary copied in)
# and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then echo "a test failed: no benchmarks" | tee -a "$F"; exit 1; fi
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch base (e71c24b) -p 512 -n 128" | tee -a "$F"
  ./target/release/kestrel_base bench --model /tmp/$arch -p 512 -n 128 2>&1 | grep -E "^\| (pp512|tg128) |GPU time of one 512|decode step:" | tee -a "$F"
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep "decode step:" "$F" | tail -1
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
