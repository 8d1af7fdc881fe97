#!/usr/bin/env bash
# Session 36, p2: route_norm's diagnosis, round 1 of session35-p5.sh (26B decode: off / on / late
# loads / no hand-off, alternating). Build: pack.sh, then the two route_norm patches' kestrel
# binaries as kestrel_np / kestrel_nh (pack-patch.sh or an in-tree apply). Carry
# target/carry/{kestrel,kestrel_np,kestrel_nh}.gz and .gl. ≈ 4 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P5="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_DEFAULTS=1
ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_ROUTE_NORM=1
BIN=kestrel_np ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_ROUTE_NORM=1
BIN=kestrel_nh ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P5" KESTREL_ROUTE_NORM=1
echo "== end ($(date -u +%T))" | tee -a "$F"
