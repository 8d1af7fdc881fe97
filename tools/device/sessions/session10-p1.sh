#!/usr/bin/env bash
# Session 10, probe 1: the deferred norms (qmv_norm_def.wgsl / qmv_norm_parts.wgsl). The kernel
# and fixture tests on the H200 (subgroups of 32: the forms lavapipe does not run), then decode
# A/B on E2B and E4B in one binary: deferred (default) vs the prologue form
# (KESTREL_FUSE_NORMS=pro) vs every norm its own dispatch (=0), the default again last.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | grep -E "^test |test result" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|max" | tail -12 | tee -a "$F"
for a in e2b e4b; do ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1; done
for a in e2b e4b; do
  ab_run "$F" $a
  ab_run "$F" $a KESTREL_FUSE_NORMS=pro
  ab_run "$F" $a KESTREL_FUSE_NORMS=0
  ab_run "$F" $a
done
date -u | tee -a "$F"
