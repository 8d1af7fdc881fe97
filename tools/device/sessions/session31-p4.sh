#!/usr/bin/env bash
# Session 31, p4 (written in session 31, not run there): two more one-workgroup-per-head
# kernels on fewer threads, after sessions 30 and 31 found attention_short (1024 → 512) and the
# decode norms (1024 → 512) faster in the pipelined step while their serialised times did not
# move. qkv_norm_rope's heads up to 256 wide on 64 threads (KESTREL_HEAD_NORM_WG=64; default
# 128; session 18 ran 64 on chunks only: even) and attention_short's largest workgroup at 256
# (KESTREL_ATTN_SHORT_WG=256; default 512; 256 is the form for devices that take no more, never
# run in the step). Decode A/B, one process each, alternating default / head-norm 64 / short 256,
# two rounds, on E2B, E4B and the 26B; then the fixtures at each knob (the 256-thread short form
# has no kernel case at that size on a device that takes 512: the fixtures are its check here;
# adopt it only with one). ≈ 7 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
date -u | tee "$F"
P="tg128|decode step:|^\| (qkv_norm_rope[a-z_0-9]*|attention_short[a-z_0-9]*) "
tg_ab "$F" "e2b e4b 26b-a4b" "$P" KESTREL_DEFAULTS=1 KESTREL_HEAD_NORM_WG=64 KESTREL_ATTN_SHORT_WG=256
for k in KESTREL_HEAD_NORM_WG=64 KESTREL_ATTN_SHORT_WG=256; do
  echo "== kfixtures $k ($(date -u +%T))" | tee -a "$F"
  env $k KESTREL_REQUIRE_GPU=1 timeout 150 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|panicked|FAILED|differ" | tee -a "$F"
done
echo "== end ($(date -u +%T))" | tee -a "$F"
