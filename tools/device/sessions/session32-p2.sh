#!/usr/bin/env bash
# Session 32, p2 (written in session 32, which had no device; run after p1, and only if p1's
# own_kv gains): the own-row form with one prologue for q, k and v
# (tools/experiments/own-kv-merged-prologue.patch, session 32 #2: one L2 round trip and ≈ 8
# barriers fewer per KV-owning layer's attention, estimated 1–1.5 µs) against the built form's
# two prologues. The patch crashes lavapipe, so it is not in tree: its binaries come as
# kestrel_own2 / ktests_own2. First its kernel test on the H200 (o against the CPU reference,
# one-token decodes bitwise the verify step), then decode A/B, one process each, alternating
# own_kv off / the built form / the merged form, two rounds on the three models. ≈ 7 min warm.
# The patch applies to 404d7fe; rebase it onto the staging-row form (da79e61) first, or run this
# from a 404d7fe checkout. Build (after `bash tools/device/pack.sh --tests`):
#   bash tools/device/pack-patch.sh tools/experiments/own-kv-merged-prologue.patch own2
# Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p2.txt"
date -u | tee "$F"
[ -x target/release/kestrel_own2 ] || { echo "no target/carry/kestrel_own2.gz: see this script's header" | tee -a "$F"; exit 1; }
echo "== ktests_own2 own_kv_attention ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests_own2 own_kv_attention --nocapture 2>&1 | grep -E "FAIL|test result|panicked|bitwise" | tee -a "$F"
P="tg128|decode step:|^\| (attention_short|qkv_norm_rope)"
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    ab_bench "$F" $a "-p 16 -n 128" "$P" KESTREL_OWN_KV=0
    ab_bench "$F" $a "-p 16 -n 128" "$P" KESTREL_OWN_KV=1
    BIN=kestrel_own2 ab_bench "$F" $a "-p 16 -n 128" "$P" KESTREL_OWN_KV=1
  done
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
