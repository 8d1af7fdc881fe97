#!/usr/bin/env bash
# Session 17, final: the kernel tests (with the ignored tensor-core ones) and the fixtures end
# to end on the H200, stopping there if any fails; kbench's 256 MiB mat-vec; then per arch the
# session's base binary (c0e3444, carried as target/carry/kestrel_base.gz) with `-p 512 -n 128`,
# the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) and the transformers peer (eager) in
# the same call; on E4B also the chunk norms in rmsnorm.wgsl's form and at 128 threads per row
# (KESTREL_NORM_ROWS=0 / 128, -n 8) beside the default (256). ≈ 8 min. Carry target/carry
# (tools/device/pack.sh --tests, then the base binary copied in) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then echo "a test failed: no benchmarks" | tee -a "$F"; exit 1; fi
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch base (c0e3444) -p 512 -n 128" | tee -a "$F"
  ./target/release/kestrel_base bench --model /tmp/$arch -p 512 -n 128 2>&1 | grep -E "^\| (pp512|tg128) |GPU time of one 512|decode step:" | tee -a "$F"
  echo "== $arch (default)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep "decode step:" "$F" | tail -1
  if [ $arch = e4b ]; then
    for s in 0 128; do
      ab_bench "$F" e4b "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| rmsnorm" KESTREL_NORM_ROWS=$s
    done
  fi
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
date -u | tee -a "$F"
