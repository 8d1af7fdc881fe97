#!/usr/bin/env bash
# Built in session 19 for the next session's first call (PERF_NOTES.md, session 19 #6–#8):
# the fixtures with a chunk's LM head on the mat-vec (KESTREL_LM_HEAD_MATVEC=1) and its chunk
# A/B on E2B, E4B, 26B; the tensor-core kernel test and the fixtures with the double-buffered bias steps
# (KESTREL_QMM_BIAS_DB=1, never run on a tensor-core GPU yet), then its chunk A/B on E4B and
# E2B (0 1 0 1, -p 512 -n 8); the staged router's latency rows and 26B tg128 with
# KESTREL_ROUTER_STAGED 0 1 0 1; first of all the kernel tests as default. ≈ 9 min (trimmed in session 20 to fit one call: E4B 0 1 0 1, E2B and 26B 0 1 for the LM head, E4B only for the bias steps). Carry target/carry (tools/device/pack.sh --tests) and
# .gl. The per-round probe (tools/experiments/qmm-coop-round-cost.patch) is a second call:
# KBENCH=./target/release/kbench_probe bash tools/device/qmm-round-cost.sh.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-lmhead-biasdb-router.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
# The kernel tests as default first: 276fbfa refactored the tensor-core mat-mats' bias staging
# after session 19's last H200 run (the same operations; naga-validated only).
echo "== tests/kernels.rs --include-ignored (default)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
# First the chunk's LM head on the mat-vec (session 19 #8, the largest predicted step): the
# fixtures with it, then its chunk A/B.
echo "== tests/fixtures.rs wgpu, KESTREL_LM_HEAD_MATVEC=1" | tee -a "$F"
KESTREL_LM_HEAD_MATVEC=1 KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if grep -qE "FAILED|panicked" "$F"; then
  echo "the LM head on the mat-vec fails: no A/B" | tee -a "$F"
else
  PAT="^\| pp512 |GPU time of one 512|^\| qmm_coop_q4|^\| qmv_q4|^\| group_sum"
  PP_ARCHS=e4b pp_ab "$F" KESTREL_LM_HEAD_MATVEC "$PAT"
  PP_ARCHS="e2b 26b-a4b" AB_VALUES="0 1" pp_ab "$F" KESTREL_LM_HEAD_MATVEC "$PAT"
fi
echo "== tests/kernels.rs qmm_coop, KESTREL_QMM_BIAS_DB=1" | tee -a "$F"
KESTREL_QMM_BIAS_DB=1 KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests --include-ignored qmm_coop 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -20 | tee -a "$F"
echo "== tests/fixtures.rs wgpu, KESTREL_QMM_BIAS_DB=1" | tee -a "$F"
KESTREL_QMM_BIAS_DB=1 KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if grep -qE "FAILED|panicked|FAIL " "$F"; then
  echo "double-buffered bias steps (or the LM head above) fail: no A/B" | tee -a "$F"
else
  PP_ARCHS=e4b pp_ab "$F" KESTREL_QMM_BIAS_DB "^\| pp512 |GPU time of one 512|^\| qmm_coop"
fi
echo "== kbench router_topk" | tee -a "$F"
timeout 60 ./target/release/kbench router_topk 2>&1 | grep -E "^\| (copy|router_topk)" | tee -a "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for s in 0 1 0 1; do ab_bench "$F" 26b-a4b "-p 16 -n 128" "^\| tg128 |decode step:|^\| router_topk" KESTREL_ROUTER_STAGED=$s; done
rm -rf /tmp/26b-a4b
date -u | tee -a "$F"
