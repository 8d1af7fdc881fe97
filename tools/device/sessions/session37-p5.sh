#!/usr/bin/env bash
# Session 37, p5 (run inline in the call; this file is that command): route_norm's loss with a
# neighbour left out of the 26B's step (KESTREL_SKIP, wrong output: timings only): the routed
# experts (qmv_moe), then the dense GeGLU (qmv_glu), each with route_norm off then on.
# Carry target/carry/kestrel.gz and .gl. ≈ 70 s warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5.txt"
P="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router|qmv)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_SKIP=qmv_moe
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_SKIP=qmv_moe KESTREL_ROUTE_NORM=1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_SKIP=qmv_glu
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_SKIP=qmv_glu KESTREL_ROUTE_NORM=1
echo "== end ($(date -u +%T))" | tee -a "$F"
