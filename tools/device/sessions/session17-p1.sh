#!/usr/bin/env bash
# Planned first call of session 17 (PERF_NOTES.md, session 16, next steps): two forms of
# attention_coop built in session 16 after its device time was spent, off by default until
# measured — the sums form (KESTREL_ATTN_SUMS=1: its output's sums over each 64-dim value stage,
# the o projection's group sums of x, instead of a group_sum pass) and the key-split form
# (KESTREL_ATTN_COOP_SPLITS=2: each tile's keys over 2 workgroups, merged by
# attention_combine). attention_coop's kernel test (all three forms), the fixtures end to end
# with each on, kbench's prefill attention rows, then pp512 on E2B, E4B and 26B with the
# default, the sums form and 2 splits, twice over. ≈ 8 min. Carry target/carry
# (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-sums.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
for v in KESTREL_ATTN_SUMS=1 KESTREL_ATTN_COOP_SPLITS=2 KESTREL_ATTN_COOP_SPLITS=3; do
  echo "== tests/fixtures.rs wgpu, $v" | tee -a "$F"
  env $v KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$F"
done
echo "== kbench prefill attention" | tee -a "$F"
timeout 120 ./target/release/kbench attention_coop 2>&1 | grep -E "^\| (E2B|E4B) " | tee -a "$F"
# Per arch, one synthetic model: default, sums, 2 splits, twice over (one process each).
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for rep in 1 2; do
    for v in KESTREL_ATTN_SUMS=0 KESTREL_ATTN_SUMS=1 KESTREL_ATTN_COOP_SPLITS=2; do
      ab_bench "$F" $a "-p 512 -n 8" "^\| pp512 |GPU time of one 512|^\| (group_sum|attention_coop|attention_combine)" $v
    done
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
