#!/usr/bin/env bash
# Single-kernel benchmarks (benches/kernels.rs, carried as kbench) on the machine with the GPU.
# Each table's rows run after 40 ms of saturating copies (the GPU lowers its clock within a
# second of light load); times are the best of three passes of back-to-back dispatches, against
# the copy kernel's bandwidth in the same process. Output: $OUT/kbench.txt (or --out NAME).
#
# usage: bash tools/device/kbench.sh [--shapes LIST] [--clocks] [--out NAME] [FILTER ...] [--sweep]
#   FILTER        row labels to run (kbench's own filter: qmv, qmv_q4_t, rmsnorm, attention,
#                 router, stream_read, stream_layout, persistent_chain, grid_barrier, ...);
#                 none: every table
#   --sweep       with qmv: every lanes × rows-per-team variant too
#   --shapes LIST only these mat-vec shapes (KBENCH_SHAPES: "256 MiB,E4B gate|up")
#   --clocks      log the SM and memory clocks every 50 ms beside it ($OUT/clocks.csv)
# examples:
#   bash tools/device/kbench.sh --shapes "256 MiB" qmv_q4_t     # the 256 MiB mat-vec bar
#   bash tools/device/kbench.sh stream_read                     # the bare-read curve (stream_floor.py)
#   bash tools/device/kbench.sh --clocks stream_layout
#   bash tools/device/kbench.sh rmsnorm attention router         # one-workgroup latency chains
# Carry target/carry/kbench.gz (pack.sh --tests) and .gl.
set -uo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
outname=kbench.txt clocks=0 args=()
while [ $# -gt 0 ]; do
  case $1 in
    --shapes) export KBENCH_SHAPES=$2; shift 2 ;;
    --clocks) clocks=1; shift ;;
    --out) outname=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
. tools/device/env.sh
F="$OUT/$outname"
gpu_info "$F"
have kbench "$F" || exit 1
if [ $clocks = 1 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem --format=csv -lms 50 > "$OUT/clocks.csv" &
  smi=$!
fi
./target/release/kbench ${args[@]+"${args[@]}"} 2>&1 | tee -a "$F"
[ $clocks = 1 ] && kill "$smi"
echo "== end ($(date -u +%T))" | tee -a "$F"
