#!/usr/bin/env bash
# Session 18, final: the kernel tests (with the ignored tensor-core ones) and the fixtures end
# to end on the H200 — also with KESTREL_NORM_ROWS=0, where chunk norms keep rmsnorm.wgsl's
# form and group_sum writes every sum (0d1131d changed who decides which norms write them, a
# host path only tensor-core devices run). If any fails, the table is made with the binary
# before that change (target/carry/kestrel_pre.gz, 489a013's defaults) and says so. Then per
# arch (E4B first) the session's base binary (f7e445c, kestrel_base.gz) with `-p 512 -n 128`,
# the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) and the transformers peer (eager) in the
# same call; then E4B's tg128 with decode norms at 256 / 1024 threads. ≈ 8 min. Carry target/carry (tools/device/pack.sh --tests, then the two other
# binaries copied in) and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_NORM_ROWS=0" | tee -a "$F"
KESTREL_NORM_ROWS=0 KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then
  echo "a test failed: the table below is kestrel_pre's (489a013), not HEAD's" | tee -a "$F"
  K=./target/release/kestrel_pre
fi
for arch in e4b e2b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch base (f7e445c) -p 512 -n 128" | tee -a "$F"
  ./target/release/kestrel_base bench --model /tmp/$arch -p 512 -n 128 2>&1 | grep -E "^\| (pp512|tg128) |GPU time of one 512|decode step:" | tee -a "$F"
  echo "== $arch (default, $K)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  rm -rf /tmp/$arch
done
# Decode's norms at 1024 threads (session 13 #4: decode norms faster, chunk norms slower; chunks
# now run the rows form, so the knob reaches decode and verify only): tg128 256 / 1024 twice.
$K synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for w in 256 1024 256 1024; do ab_run "$F" e4b KESTREL_RMSNORM_WG=$w; done
date -u | tee -a "$F"
