#!/usr/bin/env bash
# Session 13, the KV-sharing layers' q norm inside attention_split (PERF_NOTES.md, session 13):
# the split-attention kernel test (both forms) and the fixtures on the H200, then decode
# (tg128 after a 16-token prompt), the verify rows and the timestamped attention/norm rows on
# E2B and E4B (26B has no KV-sharing layers), KESTREL_ATTN_QNORM=0 / 1 / 0 / 1 in one binary.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/attn-qnorm.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests split_attention --nocapture 2>&1 | grep -E "qnorm.*OK|test result|panicked" | grep -cE "qnorm.*OK" | sed 's/^/split attention q-norm cases OK: /' | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests split_attention 2>&1 | grep -E "test result" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ" | tee -a "$F"
for a in e2b e4b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 0 1 0 1; do
    ab_bench "$F" $a "-p 16 -n 128" "^\| (tg128|[1-5]) |decode step:|^\| (head_norm_rope|attention_split)" KESTREL_ATTN_QNORM=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
