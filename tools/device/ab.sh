#!/usr/bin/env bash
# A/B of tuning settings (or of two builds) on synthetic models: each setting runs as its own
# `kestrel bench` process, the settings in turn, for ROUNDS rounds (alternating, so drift of the
# machine falls on every setting alike). Output: $OUT/ab.txt (or --out NAME), one "== ARCH round R:
# LABEL" header per run and the lines of its output that match the pattern.
#
# usage: bash tools/device/ab.sh [options] ARCHS SETTING [SETTING ...]
#   ARCHS      one model or a quoted list: e2b, e4b, 26b-a4b ("e2b e4b")
#   SETTING    what a run differs by; also its label:
#                "" or defaults          the defaults
#                key=value[,key=value]   a tuning string (kestrel bench --tuning ...)
#                --skip LABEL[,LABEL]    any kestrel bench arguments, when it starts with "-"
#                @NAME [SETTING]         target/release/NAME instead of kestrel (a second build
#                                        packed with pack.sh --suffix), with an optional setting
# options:
#   --rounds N       rounds (default 2)
#   --bench "ARGS"   kestrel bench arguments (default "-p 16 -n 128": tg128 after a one-token
#                    context; "-p 512 -n 8" for prefill A/Bs, "-d 512" for a longer context)
#   --grep PATTERN   the output lines kept (default: tuning, pp512, tg128, the decode step, the
#                    chunk's GPU time, the verify rows)
#   --profile        keep the per-kernel profile rows too
#   --out NAME       output file name under $OUT (default ab.txt)
# examples:
#   bash tools/device/ab.sh e4b "fuse_wide=gated" "fuse_wide=none"
#   bash tools/device/ab.sh "26b-a4b e4b" "norm_threads=1024" "norm_threads=256" defaults
#   bash tools/device/ab.sh "e2b e4b" defaults "--skip qmv_q4_t1_l8_r1" "--skip qmv_gelu_b"
#   bash tools/device/ab.sh --bench "-p 512 -n 8" "e2b e4b 26b-a4b" tensor_cores=off defaults
#   bash tools/device/ab.sh "e2b e4b" @kestrel_base defaults
# Carry target/carry/kestrel.gz (and any second build) and .gl.
set -uo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
rounds=2 bench="-p 16 -n 128" profile=0 outname=ab.txt
pattern='tuning:|^\| (pp512|tg128) |decode step:|GPU time of one 512|^\| [1-8] \| [0-9.]+ \| [0-9.]+ \|$'
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --grep) pattern=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    --out) outname=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "unknown option $1 (settings go after ARCHS)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then usage >&2; exit 2; fi
[ $profile = 1 ] && pattern="$pattern|^\| [a-z_0-9]+ \| [0-9]+ \| "
archs=$1; shift
. tools/device/env.sh
F="$OUT/$outname"
gpu_info "$F"
echo "kestrel bench $bench; settings: $(printf '[%s] ' "$@")" | tee -a "$F"

run() { # run ARCH ROUND SETTING
  local arch=$1 round=$2 setting=$3 bin=kestrel
  local label=${setting:-defaults}
  if [[ $setting == @* ]]; then
    bin=${setting%% *}; bin=${bin#@}
    [[ $setting == *" "* ]] && setting=${setting#* } || setting=
  fi
  local args=()
  case $setting in
    ""|defaults) ;;
    -*) read -ra args <<< "$setting" ;;
    *) args=(--tuning "$setting") ;;
  esac
  echo "== $arch round $round: $label" | tee -a "$F"
  # shellcheck disable=SC2086
  ./target/release/$bin bench --model "$MODELS/$arch" $bench ${args[@]+"${args[@]}"} 2>&1 | grep -E "$pattern" | tee -a "$F"
}

for arch in $archs; do
  synth "$arch"
  for r in $(seq "$rounds"); do
    for s in "$@"; do run "$arch" "$r" "$s"; done
  done
  rm -rf "${MODELS:?}/$arch"
done
echo "== end ($(date -u +%T))" | tee -a "$F"
