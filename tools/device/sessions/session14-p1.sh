#!/usr/bin/env bash
# The prefetch role was removed after this run (lost; benches/results/2026-12-01-h200-session14-p1-norm-prefetch.txt): git apply tools/experiments/decode-prefetch-role.patch at d79f4cb to rerun it.
# Planned first call of session 14 (PERF_NOTES.md, session 13, next steps): the decode kernels'
# prefetch role (KESTREL_PREFETCH=1: 264 extra workgroups beside each standalone norm and
# attention_combine read the next mat-vec's first 16 MiB of weights into L2 while the kernel's
# few workgroups work), built in session 13 after its device time was spent. The kernel tests
# and the fixtures on the H200, then decode (tg128 after a 16-token prompt), the verify rows
# and the timestamped norm, merge and mat-vec rows on E4B and 26B (standalone norms) and E2B
# (norms inside the mat-vecs: the merge's role only), 0 / 1 / 0 / 1 in one binary. ≈ 5 min. Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/norm-prefetch.txt"
K=./target/release/kestrel
date -u | tee "$F"
KESTREL_KERNELS=rmsnorm KESTREL_REQUIRE_GPU=1 ./target/release/ktests every_kernel 2>&1 | grep -E "test result|FAIL" | head -5 | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests split_attention 2>&1 | grep -E "test result|panicked" | tee -a "$F"
KESTREL_PREFETCH=1 KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ" | tee -a "$F"
# What the 264 extra workgroups cost beside a one-workgroup norm and the merge (their 16 MiB
# L2-resident).
./target/release/kbench rmsnorm 2>&1 | grep -E "^\| rmsnorm \| n 2560, chain 1" | tee -a "$F"
./target/release/kbench attention_combine 2>&1 | grep -E "^\| attention_combine \| 131 keys" | tee -a "$F"
for a in e4b 26b-a4b e2b; do
  $K synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for s in 0 1 0 1; do
    ab_bench "$F" $a "-p 16 -n 128" "^\| (tg128|[1-5]) |decode step:|^\| (rmsnorm|attention_combine|qmv_)" KESTREL_PREFETCH=$s
  done
  rm -rf /tmp/$a
done
date -u | tee -a "$F"
