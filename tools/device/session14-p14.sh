#!/usr/bin/env bash
# Session 14, fourteenth (last) call: attention_coop with its rescale flag 16 bytes wide (p13:
# the 4-byte flag misaligned the tensor-core arrays). Its kernel test and qmm_coop's, then, if it
# passes, the fixtures end to end, kbench's prefill attention rows and pp512 with
# KESTREL_ATTN_COOP 0 / 1 / 0 / 1 on E2B, E4B and 26B. ≈ 5 min. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/t.log 2>&1
echo "OK cases: $(grep -c ' OK$' /tmp/t.log), FAIL: $(grep -c 'FAIL' /tmp/t.log)" | tee -a "$F"
grep -E "FAIL|test result" /tmp/t.log | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests qmm_coop --include-ignored 2>&1 | grep -E "test result|panicked" | tee -a "$F"
grep -q "test result: ok" /tmp/t.log || exit 0
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
echo "== kbench prefill attention" | tee -a "$F"
timeout 120 ./target/release/kbench attention 2>&1 | grep -E "^\| (E2B|E4B) " | tee -a "$F"
for a in e2b e4b 26b-a4b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 0 1 0 1; do
    ab_bench "$F" $a "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| attention_(d|coop)" KESTREL_ATTN_COOP=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
