#!/usr/bin/env bash
# Session 31, p5 (written in session 31, not run there): the ceiling of session 29's design,
# the KV-owning layers' qkv_norm_rope off the decode chain, before building it (3–4 h with its
# tests). tools/experiments/kv-tail-probe.patch (wrong output) runs those dispatches in a second
# pass after the decode step's and lets attention norm q from the raw row; the design would add
# the own row's k norm + rope and v norm to attention's prologue (≈ 0.5–1 µs a layer), so the
# probe's gain is its upper bound. Session 29 estimated the design at E2B +1.2 %, E4B +1.4 %,
# 26B +2 %; build it only if the probe gains clearly more than that plus the prologue
# (E2B 15, E4B 24, 26B 30 KV-owning layers a step).
# Decode A/B in one binary, one process each, alternating KESTREL_KV_TAIL_PROBE=0 / 1, two
# rounds per model, then once KESTREL_SKIP=qkv_norm_rope (the dispatches gone altogether:
# session 25 #2's ceiling, 5.2 µs each on E4B then). The "decode step" line's pass timestamps
# do not include the tail pass (the profiled step does not run it): read tg128. ≈ 6 min warm.
# Needs the probe binary beside pack.sh's:
#   git worktree add /tmp/probe HEAD && (cd /tmp/probe && git apply tools/experiments/kv-tail-probe.patch
#     && cargo build --release --bin kestrel) && strip -o target/carry/kestrel_kvtail
#     /tmp/probe/target/release/kestrel && gzip -9 target/carry/kestrel_kvtail
# (after `bash tools/device/pack.sh`, which empties target/carry). Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p5.txt"
date -u | tee "$F"
P="tg128|decode step:"
run() {
  local bin=$1 a=$2; shift 2
  echo "== $a $bin $*" | tee -a "$F"
  env "$@" ./target/release/$bin bench --model /tmp/$a -p 16 -n 128 2>&1 | grep -E "$P" | tee -a "$F"
}
[ -x target/release/kestrel_kvtail ] || { echo "no target/carry/kestrel_kvtail.gz: see this script's header" | tee -a "$F"; exit 1; }
for a in e2b e4b 26b-a4b; do
  ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
  for r in 1 2; do
    run kestrel_kvtail $a KESTREL_KV_TAIL_PROBE=0
    run kestrel_kvtail $a KESTREL_KV_TAIL_PROBE=1
  done
  run kestrel $a KESTREL_SKIP=qkv_norm_rope
  rm -rf /tmp/$a
done
echo "== end ($(date -u +%T))" | tee -a "$F"
