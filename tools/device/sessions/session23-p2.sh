#!/usr/bin/env bash
# Session 23, second call: the persistent-kernel probe again, 132 workgroups only (p1's
# 264-workgroup forms were not resident at once and spun until killed, 150 s each), now with
# the first loads of a stage inside the barrier (after the workgroup's arrival) as a third
# place, and workgroups of 256, 512 and 1024 threads; batches of 4 vec4s, then 2. The kernel
# test first (it changed). ≈ 3 min. Carry target/carry (pack.sh --tests) and .gl.
# (As it ran, the harness's time_chain timed the chains from an idle pass; it now records `reps`
# untimed chains before the timed ones in the same pass, as `time` does for single kernels.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2-persistent-chain.txt"
date -u | tee "$F"
echo "== tests/kernels.rs persistent_chain" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests persistent_chain 2>&1 | grep -E "^test |test result|panicked|NMSE|bitwise" | tee -a "$F"
for pf in 4 2; do
  echo "== kbench persistent_chain, batches of $pf" | tee -a "$F"
  KBENCH_SHAPES=none KBENCH_CHAIN_PF=$pf timeout -s KILL 200 ./target/release/kbench persistent_chain 2>&1 | grep -E "^copy|^\| (chain|E2B|E4B)|error|skipped" | tee -a "$F"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$F"
done
date -u | tee -a "$F"
