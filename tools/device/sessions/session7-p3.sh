#!/usr/bin/env bash
# Session 7, probe 3: the ceilings of two decode fusions: steps with the residual norms
# (KESTREL_EXP_SKIP=residual_norm, chained input norms included) or attention_combine skipped,
# from a binary built with tools/experiments/skip-dispatches.patch (target/release/kestrel-exp;
# its output tokens are wrong, its step time is what the fusion could at most save).
set -uo pipefail
. tools/device/env.sh
date -u | tee "$OUT/exp.txt"
for arch in e2b e4b; do
  ./target/release/kestrel-exp synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for skip in none residual_norm attention_combine residual_norm,attention_combine; do
    echo "== $arch exp skip=$skip" | tee -a "$OUT/exp.txt"
    KESTREL_EXP_SKIP=$skip ./target/release/kestrel-exp bench --model /tmp/$arch -p 128 -n 128 2>&1 | grep -E "tg128|decode step:" | tee -a "$OUT/exp.txt"
  done
  rm -rf /tmp/$arch
done
