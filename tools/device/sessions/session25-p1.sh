#!/usr/bin/env bash
# Session 25, first call: the checks session 24 left for the H200 with QMV_MAX_LANES = 32 (kernel
# tests with the tensor-core ones, the fixtures end to end, full output kept in $OUT), then where
# a decode step's time goes, measured by leaving kernels out (KESTREL_SKIP: the step without a
# kernel class against the step with it, same binary, one process per setting; wrong output,
# timings only). -p 16 -n 128 as every decode A/B. ≈ 8 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs --include-ignored (full output: $OUT/ktests.txt)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored > "$OUT/ktests.txt" 2>&1; echo "exit $?" | tee -a "$F"
grep -E "test result|FAIL|panicked" "$OUT/ktests.txt" | tee -a "$F"
echo "== tests/fixtures.rs wgpu (full output: $OUT/kfixtures.txt)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu > "$OUT/kfixtures.txt" 2>&1; echo "exit $?" | tee -a "$F"
grep -E "test result|FAIL|panicked|differ" "$OUT/kfixtures.txt" | tee -a "$F"
P="tg128|decode step:|over [0-9]+ dispatches"
skips() {
  local arch=$1; shift
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch full bench output of the baseline: $OUT/bench-$arch.txt" | tee -a "$F"
  ./target/release/kestrel bench --model /tmp/$arch -p 16 -n 128 > "$OUT/bench-$arch.txt" 2>&1
  grep -E "$P" "$OUT/bench-$arch.txt" | tee -a "$F"
  for s in "$@"; do ab_bench "$F" $arch "-p 16 -n 128" "$P" KESTREL_SKIP=$s; done
  ab_bench "$F" $arch "-p 16 -n 128" "$P" KESTREL_SKIP=
  rm -rf /tmp/$arch
}
ONLY_QMV="rmsnorm,attention_,qkv_norm_rope,embed,softcap,argmax,moe_norm,router_topk,matmul_q8"
skips e4b rmsnorm attention_ qkv_norm_rope qmv_q4_t1_l8_r4 qmv_ "$ONLY_QMV"
skips 26b-a4b rmsnorm attention_ moe_norm router_topk,matmul_q8 qmv_moe qmv_ "$ONLY_QMV"
skips e2b rmsnorm attention_ qmv_ "$ONLY_QMV"
echo "== end ($(date -u +%T))" | tee -a "$F"
