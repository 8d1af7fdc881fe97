#!/usr/bin/env bash
# Session 8, probe 4: E2B decode with the KV-sharing layers' input norm fused into their q
# projection too (the final run's binary fused only the stacked q|k|v): default, unfused,
# default again (the first bench of a fresh machine ran slow in the final run).
set -uo pipefail
. tools/device/env.sh
F="$OUT/p4.txt"
date -u | tee "$F"
./target/release/kestrel synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1
for v in KESTREL_FUSE_NORMS=1 KESTREL_FUSE_NORMS=0 KESTREL_FUSE_NORMS=1; do ab_run "$F" e2b $v; done
date -u | tee -a "$F"
