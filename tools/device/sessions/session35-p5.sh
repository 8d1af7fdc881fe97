#!/usr/bin/env bash
# Session 35, p5 (written, not run: no device time was left): why route_norm lost (p4). The same
# kernel with the router's weights loaded after the norm instead of held in registers across it
# (`kestrel_np`: tools/experiments/route-norm-late-loads.patch), and without the hand-off (norm +
# router in one dispatch, router_topk still its own: `kestrel_nh`:
# tools/experiments/route-norm-no-handoff.patch), against route_norm off and as committed, 26B
# decode, alternating, two rounds, with the route_norm / rmsnorm rows of the
# timestamped profile; then kbench's dependent-chain rows (held clock) of route_norm and of the
# three dispatches it replaces at the 26B's shapes (rmsnorm n 2816 chain 3, the router's
# matmul_q8_t1, router_topk). Build: bash tools/device/pack.sh --tests && bash
# tools/device/pack-patch.sh tools/experiments/route-norm-late-loads.patch np && bash
# tools/device/pack-patch.sh tools/experiments/route-norm-no-handoff.patch nh. ≈ 7 min warm.
# Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name --format=csv | tee -a "$F"
P="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for r in 1 2; do
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_DEFAULTS=1
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1
  BIN=kestrel_np ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1
  BIN=kestrel_nh ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1
done
# The norm's threads: route_norm at 256 (32 workgroups of 4 router rows, 11 values a thread)
# against the same norm width without it (KESTREL_RMSNORM_WG sets every decode norm's).
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_RMSNORM_WG=256
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_RMSNORM_WG=256 KESTREL_ROUTE_NORM=1
rm -rf /tmp/26b-a4b
echo "== kbench: route_norm against its three, chains of one kernel ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="26B router" timeout 120 ./target/release/kbench matmul_q8 2>&1 | grep -E "copy roofline|26B router" | tee -a "$F"
timeout 120 ./target/release/kbench rmsnorm 2>&1 | grep -E "n 2816, chain 3" | tee -a "$F"
timeout 120 ./target/release/kbench route 2>&1 | grep -E "route_norm|router_topk" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
