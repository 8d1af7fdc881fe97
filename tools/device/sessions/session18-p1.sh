#!/usr/bin/env bash
# Planned first call of session 18 (PERF_NOTES.md, session 17 #6–#7): two forms built in
# session 17 and not yet measured, both off by default. (a) The residual norms over split-k
# partials (KESTREL_NORM_SPLITS=1): the rmsnorm kernel cases, the fixtures with it on, pp512
# 0 / 1 / 0 / 1 on E2B, E4B and 26B. (b) The head norms on fewer threads per head
# (KESTREL_HEAD_NORM_WG=64|128: every head dim ≤ 4 · WG takes it; E2B/E4B's 512-dim heads need
# 128): kernel cases, fixtures, then pp512 and tg128 at 256 / 128 / 256 / 128 on E4B (decode
# runs the same kernel). ≈ 7 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-splits-head-wg.txt"
date -u | tee "$F"
KESTREL_KERNELS=norm KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/ktests every_kernel --nocapture 2>&1 | grep -E "^(rmsnorm|head_norm)[_a-z0-9]* +[0-9]|FAIL|test result|panicked" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/ktests norm 2>&1 | grep -E "^test |FAIL|panicked" | tee -a "$F"
for v in KESTREL_NORM_SPLITS=1 KESTREL_HEAD_NORM_WG=128 KESTREL_HEAD_NORM_WG=64; do
  echo "== tests/fixtures.rs wgpu, $v" | tee -a "$F"
  env $v KESTREL_REQUIRE_GPU=1 timeout 100 ./target/release/kfixtures wgpu 2>&1 | tail -4 | tee -a "$F"
done
pp_ab "$F" KESTREL_NORM_SPLITS "^\| pp512 |GPU time of one 512|^\| (rmsnorm_rows|qmm_sum)"
./target/release/kestrel synth --arch e4b --quant 4bit /tmp/e4b > /dev/null 2>&1
for s in 256 128 256 128; do
  ab_bench "$F" e4b "-p 512 -n 128" "^\| (pp512|tg128) |GPU time of one 512|decode step:|^\| (qkv|head)_norm_rope" KESTREL_HEAD_NORM_WG=$s
done
date -u | tee -a "$F"
