#!/usr/bin/env bash
# BENCHMARKS.md's table run, on one machine with an NVIDIA GPU:
#   1. the GPU, its driver and clocks;
#   2. the kernel tests with the ignored tensor-core ones (ktests --include-ignored), the fixtures
#      end to end on wgpu (kfixtures), and the expert and speculative tests where carried;
#   3. the 256 MiB 4-bit mat-vec against the copy roofline (kbench);
#   4. per model: `kestrel synth --arch A --quant 4bit`, `kestrel bench -p 512 -n 128` (whole
#      output), and the transformers peer (eager, bf16) on the same config.
# Writes $OUT/table.txt and $OUT/peer-ARCH.json (and $OUT/kestrel-ARCH.json with --json).
#
# usage: bash tools/device/table.sh [--no-kernel-tests] [--no-peer] [--json] [--tuning STR] [ARCH ...]
#   ARCH             e2b, e4b, 26b-a4b (default: 26b-a4b e4b e2b)
#   --no-kernel-tests   skip step 2's kernel tests (the fixtures still run)
#   --no-peer        skip the transformers peer
#   --json           also `kestrel bench --json` per model
#   --tuning STR     KESTREL_TUNING=STR for everything the run starts (tests and benches)
# Carry target/carry (pack.sh --tests) and .gl. About 6 minutes on a warm H100 or H200.
set -uo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
ktests=1 peer=1 json=0 archs=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-kernel-tests) ktests=0; shift ;;
    --no-peer) peer=0; shift ;;
    --json) json=1; shift ;;
    --tuning) export KESTREL_TUNING=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) archs+=("$1"); shift ;;
  esac
done
[ ${#archs[@]} -gt 0 ] || archs=(26b-a4b e4b e2b)
. tools/device/env.sh
F="$OUT/table.txt"
gpu_info "$F"
[ -n "${KESTREL_TUNING:-}" ] && echo "KESTREL_TUNING=$KESTREL_TUNING" | tee -a "$F"
export KESTREL_REQUIRE_GPU=1
if [ $ktests = 1 ]; then
  echo "== tests/kernels.rs (incl. the ignored tensor-core tests: qmm_coop, attention_coop)" | tee -a "$F"
  have ktests "$F" && timeout 600 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a "$F"
fi
echo "== tests/fixtures.rs wgpu" | tee -a "$F"
have kfixtures "$F" && timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
if [ -x target/release/kexperts ]; then
  echo "== tests/experts.rs" | tee -a "$F"
  timeout 300 ./target/release/kexperts 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$F"
fi
if [ -x target/release/kspec ]; then
  echo "== tests/speculative.rs wgpu" | tee -a "$F"
  timeout 300 ./target/release/kspec wgpu 2>&1 | grep -E "^test |test result|panicked|differ|bitwise" | tee -a "$F"
fi
unset KESTREL_REQUIRE_GPU
echo "== kbench 256 MiB" | tee -a "$F"
have kbench "$F" && KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t 2>&1 | grep -E "copy roofline|^\| 256" | tee -a "$F"
for arch in "${archs[@]}"; do
  date -u | tee -a "$F"
  synth "$arch"
  echo "== $arch (kestrel bench --model $MODELS/$arch -p 512 -n 128)" | tee -a "$F"
  ./target/release/kestrel bench --model "$MODELS/$arch" -p 512 -n 128 >> "$F" 2>&1
  grep -E "^\| (pp512|tg128) |decode step:|GPU time of one 512" "$F" | tail -4
  if [ $json = 1 ]; then
    ./target/release/kestrel bench --model "$MODELS/$arch" -p 512 -n 128 --json > "$OUT/kestrel-$arch.json" 2>> "$F"
  fi
  if [ $peer = 1 ]; then
    python3 tools/peer/hf_bench.py --config "$MODELS/$arch/config.json" -p 512 -n 128 --modes eager \
      --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$F"
  fi
  rm -rf "${MODELS:?}/$arch"
done
echo "== end ($(date -u +%T))" | tee -a "$F"
