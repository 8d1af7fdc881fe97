#!/usr/bin/env bash
# Session 23, first call: the persistent-kernel probe (persistent_chain.wgsl). Its kernel test on
# this GPU (one workgroup; every form bitwise, each stage against the f64 reference), then kbench's
# chain table: 32 E2B- and E4B-shaped layers of 4-bit mat-vecs (q|k|v, o, gate|up, down) as one
# dispatch per stage against one persistent dispatch with grid barriers, with and without the next
# stage's weights loaded before each barrier; batches of 4 vec4s (every form), then 2 and 8 (the
# per-stage and prefetching forms); each run under a timeout, the 264-workgroup forms last (a grid
# that is not resident at once spins). Then the production mat-vecs of the same E4B shapes
# (kbench qmv rows) for calibration. ≈ 3 min. Carry target/carry (pack.sh --tests) and .gl.
# As it ran (09:46–09:54 UTC): each pf run was killed at its first 264-workgroup form (not
# resident at once: it spun), so only E2B's 132-workgroup rows came back; kbench's table has
# since dropped the 264-workgroup forms, so this script no longer reproduces that output.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-persistent-chain.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs persistent_chain" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests persistent_chain 2>&1 | grep -E "^test |test result|panicked|NMSE|bitwise" | tee -a "$F"
for pf in 4 2 8; do
  echo "== kbench persistent_chain, batches of $pf" | tee -a "$F"
  KBENCH_SHAPES=none KBENCH_CHAIN_PF=$pf timeout -s KILL 150 ./target/release/kbench persistent_chain 2>&1 | grep -E "^copy|^\| (chain|E2B|E4B|---)|error|skipped" | tee -a "$F"
  echo "exit $?" | tee -a "$F"
done
echo "== kbench qmv, E4B shapes (production decode mat-vecs)" | tee -a "$F"
KBENCH_SHAPES="E4B q|k|v,E4B gate|up,E4B down,E2B gate|up,E2B down" timeout 150 ./target/release/kbench qmv 2>&1 | grep -E "^\| E[24]B .* qmv_q4_t1_|^\| E[24]B .* qmv_glu|^copy" | tee -a "$F"
date -u | tee -a "$F"
