#!/usr/bin/env bash
# Session 37, p6: route_norm with its router rows spread over more workgroups
# (`KESTREL_ROUTE_ROWS`: 8 rows a 512-thread workgroup by default, 16 workgroups; 2 → 64, 1 →
# 128, each repeating the norm). If the loss is the router's cold weights pulled by 16 SMs it
# shrinks; if it is the norm every workgroup repeats it grows. 26B decode, off / on / rows 2 /
# rows 1, alternating, two rounds. Build: cargo build --release; bash tools/device/pack.sh.
# Carry target/carry/kestrel.gz and .gl. ≈ 2.5 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p6.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P="tg128|decode step:|^\| (route_norm|rmsnorm \||matmul_q8_t1|router)"
./target/release/kestrel synth --arch 26b-a4b --quant 4bit /tmp/26b-a4b > /dev/null 2>&1
for round in 1 2; do
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_DEFAULTS=1
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1 KESTREL_ROUTE_ROWS=2
  ab_bench "$F" 26b-a4b "-p 16 -n 128" "$P" KESTREL_ROUTE_NORM=1 KESTREL_ROUTE_ROWS=1
done
echo "== end ($(date -u +%T))" | tee -a "$F"
