#!/usr/bin/env bash
# Session 22, first call (it also runs the check session 21 planned as session22-p1.sh, for which
# no machine could be started; that script is removed): final_checks; moe_norm's kernel test with
# its NMSE and bitwise-equal counts per shape; tests/experts.rs's overlap test on this GPU (where
# the paired dispatches do run side by side: logits bitwise those of the serial branches on every
# tiny MoE fixture); then the 26B's decode A/B at the table's context (`kestrel bench -p 512 -n
# 128`): KESTREL_MOE_OVERLAP 0 (the branches one after the other), 1 (the dense branch beside the
# experts, the default), router (KESTREL_MOE_OVERLAP_WITH=router: beside the router and its
# top-k), twice: tg128, the step line and the MoE rows of the per-dispatch profile. ≈ 8 min. Carry
# target/carry (tools/device/pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2-moe-overlap.txt"
final_checks "$F"
echo "== moe_norm against its three dispatches and the f64 reference" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests moe_norm --nocapture 2>&1 | grep -E "moe_norm|test result|panicked|NMSE" | tee -a "$F"
echo "== tests/experts.rs overlap" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kexperts wgpu_moe_overlap --nocapture 2>&1 | grep -E "overlapped|test result|panicked|differ" | tee -a "$F"
date -u | tee -a "$F"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
P="tg128|decode step:|verify|^\| [1-5] \||^\| (qmv_|moe_|router|matmul_q8)"
for s in 0 1 router 0 1 router; do
  case $s in
    router) ab_bench "$F" 26b-a4b "-p 512 -n 128" "$P" KESTREL_MOE_OVERLAP=1 KESTREL_MOE_OVERLAP_WITH=router ;;
    *) ab_bench "$F" 26b-a4b "-p 512 -n 128" "$P" KESTREL_MOE_OVERLAP=$s ;;
  esac
done
date -u | tee -a "$F"
