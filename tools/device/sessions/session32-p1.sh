#!/usr/bin/env bash
# Session 32, p1 (written in session 32, which had no device): the KV-owning layers'
# qkv_norm_rope out of decode and verify steps (WgpuOptions::own_kv, KESTREL_OWN_KV; off by
# default until this runs). Their attention_short computes its own row's k and v from the raw
# q | k | v row (attention_own_kv.wgsl) and norms q there too; verify steps, and decode steps
# whose row is attention_split's, store their rows first by the same kernel's writer form.
# Decode steps of short rows lose one dependent dispatch per KV-owning layer (E2B 15, E4B 24,
# 26B 30). Prediction (session 29's arithmetic, less its ≈ 8 µs tail pass, which this form does
# not need): −5.2 µs of dispatch, + 2–3 µs of prologue per such layer: E2B ≈ +1.3 %, E4B
# ≈ +1.6 %, 26B ≈ +2.2 %; the prologue could cost more (its loads wait on a round trip before
# q's, then two workgroup sums and three barriers).
# Decode A/B (env.sh's tg_ab), one process each, alternating KESTREL_OWN_KV=0 / 1, two rounds on
# the three models, with the attention_short and qkv_norm_rope rows of the per-dispatch profile;
# then the own-row and split-attention kernel tests, the fixtures (incl. wgpu_own_kv_matches_
# transformers) and the wgpu speculative tests (verify bitwise sequential decode with own_kv:
# the H200's compiler may contract a form's multiply-adds differently than lavapipe's) at the
# defaults. ≈ 7 min warm. Carry target/carry (pack.sh --tests) and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
P="tg128|decode step:|^\| (attention_short|qkv_norm_rope)"
tg_ab "$F" "e2b e4b 26b-a4b" "$P" KESTREL_OWN_KV=0 KESTREL_OWN_KV=1
echo "== ktests own_kv_attention, split_attention ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests own_kv_attention split_attention 2>&1 | grep -E "FAIL|test result|panicked|bitwise" | tee -a "$F"
echo "== kfixtures ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|FAILED|differ" | tee -a "$F"
echo "== kspec wgpu ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/kspec wgpu 2>&1 | grep -E "^test |test result|panicked|differs|bitwise" | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
