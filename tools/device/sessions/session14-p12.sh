#!/usr/bin/env bash
# Session 14, twelfth call: the tensor-core kernels as Kestrel's own SPIR-V under the GLSL450
# memory model (KESTREL_COOP_SPIRV=1, kernels.rs coop_spirv) against wgpu's (=0): the
# attention_coop and qmm_coop kernel tests each way; then, if attention_coop passes, the
# fixtures, kbench's attention rows and pp512 with KESTREL_ATTN_COOP 0 / 1 / 0 / 1 on E2B, E4B
# and 26B. ≈ 5 min. Carry target/carry and .gl.
# (A record of what ran: the diagnostic forms and tests it names were removed once p13 found
# the cause; PERF_NOTES.md, session 14 #2.)
set -uo pipefail
. tools/device/env.sh
F="$OUT/attention-coop-glsl450.txt"
date -u | tee "$F"
for s in 1 0; do
  echo "== KESTREL_COOP_SPIRV=$s" | tee -a "$F"
  KESTREL_COOP_SPIRV=$s KESTREL_REQUIRE_GPU=1 timeout 120 ./target/release/ktests attention_coop_matches --include-ignored > /tmp/a$s.log 2>&1
  echo "attention_coop OK cases: $(grep -c ' OK$' /tmp/a$s.log), FAIL: $(grep -c 'FAIL' /tmp/a$s.log)" | tee -a "$F"
  grep -E "test result" /tmp/a$s.log | tee -a "$F"
  KESTREL_COOP_SPIRV=$s KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests qmm_coop --include-ignored 2>&1 | grep -E "test result|panicked" | tee -a "$F"
done
grep -E "attention_coop\(" /tmp/a1.log | tee -a "$F"
grep -q "test result: ok" /tmp/a1.log || exit 0
attn_ab "$F" X=0
date -u | tee -a "$F"
