#!/usr/bin/env bash
# Session 14, fifth call: after p4 (a row-major B load misplaces columns; one-f16 stores into a vec4 race), V staged transposed with whole-vec4 stores. The weights diagnostic, then
# the kernel test in four forms (KESTREL_ATTN_COOP_RS=1: O rescaled through column-major
# stores and loads; KESTREL_ATTN_COOP_PA=1: 2^11 P_hi staged). The first form that passes gets
# the fixtures, kbench's attention rows and pp512 0 / 1 / 0 / 1 on E2B, E4B and 26B. ≈ 6 min.
# Carry target/carry (tools/device/pack.sh --tests) and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-forms.txt"
KESTREL_REQUIRE_GPU=1 timeout 60 ./target/release/ktests attention_coop_weights --include-ignored --nocapture 2>&1 | grep -E "tokens|gpu|cpu|panicked" > "$OUT/weights.txt"
date -u | tee "$F"
good=""
for form in "X=0" "KESTREL_ATTN_COOP_RS=1" "KESTREL_ATTN_COOP_PA=1" "KESTREL_ATTN_COOP_RS=1 KESTREL_ATTN_COOP_PA=1"; do
  echo "== attention_coop kernel test, $form" | tee -a "$F"
  env $form KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/t.log 2>&1
  echo "OK cases: $(grep -c ' OK$' /tmp/t.log), FAIL: $(grep -c 'FAIL' /tmp/t.log)" | tee -a "$F"
  grep -E "FAIL" /tmp/t.log | head -4 | tee -a "$F"
  grep -E "attention_coop\\(" /tmp/t.log > "$OUT/cases-$(echo $form | tr " =" "_-").txt"
  grep -E "test result" /tmp/t.log | tee -a "$F"
  if [ -z "$good" ] && grep -q "test result: ok" /tmp/t.log; then good="$form"; fi
done
echo "== first passing form: '$good'" | tee -a "$F"
[ -n "$good" ] || exit 0
grep -E " OK$" /tmp/t.log > /dev/null
env $good KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored 2>&1 | grep -E "attention_coop\(" | tee -a "$F"
attn_ab "$F" $good
date -u | tee -a "$F"
