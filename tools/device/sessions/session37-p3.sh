#!/usr/bin/env bash
# Session 37, p3 (run inline in the call; this file is that command): is route_norm's loss the
# dense branch's overlap with the routed experts (session 22 #1)? 26B decode with
# KESTREL_MOE_OVERLAP=0, route_norm off then on, then the defaults off then on, one process per
# setting. Carry target/carry/kestrel.gz and .gl. ≈ 70 s warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p3.txt"
P5="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_MOE_OVERLAP=0
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_MOE_OVERLAP=0 KESTREL_ROUTE_NORM=1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_DEFAULTS=1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_ROUTE_NORM=1
echo "== end ($(date -u +%T))" | tee -a "$F"
