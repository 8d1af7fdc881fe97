#!/usr/bin/env bash
# Session 19, first call: the kernel tests on the H200 (the six 1024-thread rmsnorm cases of
# af1f85b had run only on lavapipe), the fixtures end to end, the decode latency rows of the
# single-workgroup kernels (floors for attention_combine and router_topk), then the dense
# tensor-core mat-mat's per-workgroup cost probe (tools/device/qmm-fixed-cost.sh; binaries built
# with tools/experiments/qmm-coop-fixed-cost.patch applied: without KESTREL_QMM_CEIL they run the
# kernel as committed). Carry target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1-tests-latency.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$F"
echo "== tests/kernels.rs --include-ignored" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/ktests --include-ignored --nocapture 2>&1 | grep -E "^test |test result|FAIL|panicked|wg=1024" | head -80 | tee -a "$F"
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
echo "== kbench latency rows" | tee -a "$F"
for k in copy attention_combine router_topk; do
  timeout 120 ./target/release/kbench $k 2>&1 | grep -E "^\| (copy|attention_combine|router_topk) " | tee -a "$F"
done
bash tools/device/qmm-fixed-cost.sh
date -u | tee -a "$F"
