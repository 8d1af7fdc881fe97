#!/usr/bin/env bash
# Session 37, p4 (run inline in the call; this file is that command): the rest of session35-p5.sh
# — route_norm at 256-thread norms (32 workgroups), and kbench's dependent chains of route_norm
# and of the three dispatches it replaces (each kernel repeated: its weights stay in L2).
# Carry target/carry/{kestrel,kbench}.gz and .gl. ≈ 80 s warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
P="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_RMSNORM_WG=256
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_RMSNORM_WG=256 KESTREL_ROUTE_NORM=1
echo "== kbench ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="26B router" timeout 100 ./target/release/kbench matmul_q8 2>&1 | grep -E "copy roofline|26B router" | tee -a "$F"
timeout 100 ./target/release/kbench rmsnorm 2>&1 | grep -E "n 2816, chain 3" | tee -a "$F"
timeout 100 ./target/release/kbench route 2>&1 | grep -E "route_norm|router_topk" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
