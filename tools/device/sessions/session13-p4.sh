#!/usr/bin/env bash
# Session 13, the decode matmul's loads issued U iterations at a time (the 26B's 8-bit router,
# matmul_q8_t1): the matmul kernel cases on the H200, then 26B decode (tg128 after a 16-token
# prompt) with KESTREL_MATMUL_U=1 (the loop as before) / 6 (the default) / 1 / 6 in one binary,
# and the router's timestamped row. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/matmul-u.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_KERNELS=matmul KESTREL_REQUIRE_GPU=1 ./target/release/ktests every_kernel 2>&1 | grep -E "test result|FAIL" | head -5 | tee -a "$F"
$K synth --arch 26b-a4b --quant 4bit /tmp/26b > /dev/null 2>&1
for u in 1 6 1 6; do
  ab_bench "$F" 26b "-p 16 -n 128" "^\| tg128 |decode step:|^\| matmul_q8" KESTREL_MATMUL_U=$u
done
date -u | tee -a "$F"
