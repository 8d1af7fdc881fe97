#!/usr/bin/env bash
# Session 27, p1: attention_short with fewer barriers (the q-norm form's sum of squares by
# workgroup_sum, two barriers where a 1024-thread tree took eleven; the value groups' sums added
# by group 0 after one barrier where a halving tree took eight; the first tile's first K and V
# batches loaded before the query) against session 26's kernel (target/carry/kestrel-old.gz:
# 23b1d49's binary). (1) the kernel tests on the H200 (the split-attention one printed); (2) kbench's
# attention_short rows (session 26 p3's, same harness); (3) decode A/B, one process each,
# alternating old / new / new at 512 threads (E2B, E4B) on E2B, E4B and the 26B
# (-p 16 -n 128); (4) the fixtures on the H200. ≈ 9 min warm. Carry target/carry (--tests, plus
# kestrel-old.gz) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
echo "== tests/kernels.rs (incl. the ignored tensor-core tests)" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -40 | tee -a "$F"
echo "== ktests split_attention" | tee -a "$F"
timeout 120 ./target/release/ktests split_attention --nocapture 2>&1 | grep -E "short|test result|panicked|FAILED" | tail -8 | tee -a "$F"
echo "== kbench attention_short ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES=none timeout 200 ./target/release/kbench attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
# ab_bin ARCH BIN [VAR=value …]: one decode run of target/release/BIN.
ab_bin() {
  local arch=$1 bin=$2; shift 2
  echo "== $arch $bin $*" | tee -a "$F"
  env "$@" ./target/release/$bin bench --model /tmp/$arch -p 16 -n 128 2>&1 | grep -E "tg128|decode step:" | tee -a "$F"
}
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bin $a kestrel-old
    ab_bin $a kestrel
    [ $a != 26b-a4b ] && ab_bin $a kestrel KESTREL_ATTN_SHORT_WG=512
  done
  rm -rf /tmp/$a
done
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
timeout 200 ./target/release/kfixtures 2>&1 | grep -E "test result|panicked|FAILED" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
