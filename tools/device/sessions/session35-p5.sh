#!/usr/bin/env bash
# Session 35, p5 (written, not run: no device time was left): why route_norm lost (p4). The same
# kernel with the router's weights loaded after the norm instead of held in registers across it
# (`kestrel_np`: tools/experiments/route-norm-late-loads.patch) against route_norm off and as
# committed, 26B decode, alternating, two rounds, with the route_norm / rmsnorm rows of the
# timestamped profile. Build: bash tools/device/pack.sh --tests && bash tools/device/pack-patch.sh
# tools/experiments/route-norm-late-loads.patch np. ≈ 4 min warm. Carry target/carry and .gl.
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
done
echo "== end ($(date -u +%T))" | tee -a "$F"
