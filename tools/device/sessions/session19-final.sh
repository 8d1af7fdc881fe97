#!/usr/bin/env bash
# Session 19, final: the kernel tests (with the ignored tensor-core ones: qmm_coop's new cases of
# runs of row tiles per workgroup, and its bias steps now loaded a step ahead by default) and the
# fixtures end to end on the H200, also with KESTREL_QMM_PERSIST=1. If any fails, the table is
# made with the session-start binary (af1f85b, target/carry/kestrel_base.gz) and says so. Then per
# arch (E4B first) the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`), the prefill A/Bs of one
# binary (-p 512 -n 8: KESTREL_QMM_PERSIST=1, KESTREL_QMM_BIAS_PF=0 = the session start's
# prefill), the transformers peer (eager); then E4B's A/Bs once more and kbench's 128 × 128 rows
# as built and in runs of tiles. ≈ 8 min. Carry target/carry (tools/device/pack.sh --tests, kestrel_base.gz copied in)
# and .gl.
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
F="${F:-$OUT/final.txt}"
final_checks "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_QMM_PERSIST=1" | tee -a "$F"
KESTREL_QMM_PERSIST=1 KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then
  echo "a test failed: the table below is kestrel_base's (af1f85b), not HEAD's" | tee -a "$F"
  K=./target/release/kestrel_base
fi
PAT="^\| (pp512|tg128) |GPU time of one 512|^\| qmm_coop"
for arch in e4b e2b 26b-a4b; do
  date -u | tee -a "$F"
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, $K)" | tee -a "$F"
  $K bench --model /tmp/$arch -p 512 -n 128 >> "$F" 2>&1
  grep -A3 "^| test" "$F" | tail -2
  grep -E "decode step:|GPU time of one 512" "$F" | tail -2
  for v in KESTREL_QMM_PERSIST=1 KESTREL_QMM_BIAS_PF=0; do ab_bench "$F" $arch "-p 512 -n 8" "$PAT" $v; done
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  [ $arch = e4b ] || rm -rf /tmp/$arch
done
date -u | tee -a "$F"
for v in KESTREL_QMM_BIAS_PF=1 KESTREL_QMM_PERSIST=1 KESTREL_QMM_BIAS_PF=0; do ab_bench "$F" e4b "-p 512 -n 8" "$PAT" $v; done
# kbench: the default and the runs of tiles (p1's KESTREL_QMM_CEIL=none rows are the kernel
# with its bias steps unprefetched, KESTREL_QMM_BIAS_PF=0).
for v in KESTREL_QMM_BIAS_PF=1 KESTREL_QMM_PERSIST=1; do
  echo "== kbench qmm_coop_q4_128x128 $v" | tee -a "$F"
  env $v timeout 120 ./target/release/kbench qmm_coop_q4_128x128 2>&1 | grep -E "^\| E[24]B" | tee -a "$F"
done
date -u | tee -a "$F"
