#!/usr/bin/env bash
# Session 22, final call: the fixtures end to end, the 256 MiB mat-vec and tests/experts.rs's
# overlap test on this GPU; then per arch, the 26B first (a call cut short still brings its row
# back), the BENCHMARKS.md run (`kestrel bench -p 512 -n 128`) and the transformers peer
# (eager). The overlap's A/B is in session22-p2.sh's and -p4.sh's output (device starts were
# refused before this call, so it was trimmed to fit the budget left). ≈ 5.5 min. Carry
# target/carry (tools/device/pack.sh --tests) and .gl. Written out inline when it ran; since
# then through env.sh's final_checks (KTESTS=0) and table_row, which run the same commands.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
# final_checks without the kernel tests (they ran in p2 and p4 with these kernels: 18/18 and the
# routed GeGLU's), to fit the device time that three refused starts left.
KTESTS=0 final_checks "$F"
echo "== tests/experts.rs overlap" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kexperts wgpu_moe_overlap 2>&1 | grep -E "test result|panicked|differ" | tee -a "$F"
for arch in 26b-a4b e4b e2b; do
  table_row "$F" $arch
done
date -u | tee -a "$F"
