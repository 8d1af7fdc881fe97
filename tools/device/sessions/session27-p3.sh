#!/usr/bin/env bash
# Session 27, p3: which of p2's barrier changes slows attention_short. Five builds of 23b1d49
# (target/carry/kestrel-V.xz, kbench-V.xz: xz, to fit the carry), each with one change (tools/experiments/
# attention-short-barriers.patch holds all): base (none), sum (group 0 adds the value groups'
# sums after one barrier; vh WG − TV vec4s), tilebar (the tile-end barrier only where another
# tile follows), qsum (the q norm's sum by workgroup_sum), vars (K and V registers declared at the
# kernel's top, loaded in the loops as before). kbench's attention_short rows per build, then
# (qsum's kbench rows would be base's: they are the plain form) E2B decode (-p 16 -n 128) once per build and base again. ≈ 4 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
for f in target/carry/*.xz; do b=$(basename "$f" .xz); python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$f" "target/release/$b"; chmod +x "target/release/$b"; done
F="$OUT/p3.txt"
date -u | tee "$F"
for v in base sum tilebar vars; do
  echo "== kbench-$v attention_short ($(date -u +%T))" | tee -a "$F"
  KBENCH_SHAPES=none timeout 60 ./target/release/kbench-$v attention_short 2>&1 | grep -E "^\| attention_short" | tee -a "$F"
done
./target/release/kestrel-base synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1
for v in base sum tilebar qsum vars base; do
  echo "== e2b kestrel-$v" | tee -a "$F"
  ./target/release/kestrel-$v bench --model /tmp/e2b -p 16 -n 128 2>&1 | grep -E "tg128|decode step:" | tee -a "$F"
done
echo "== end ($(date -u +%T))" | tee -a "$F"
