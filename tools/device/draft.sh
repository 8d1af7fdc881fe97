#!/usr/bin/env bash
# Speculative decoding with the drafter on the GPU against the decode step: per ARCH (e2b, e4b,
# 26b-a4b) the full-size 4-bit synthetic target and its synthetic MTP drafter (`kestrel synth
# --arch ARCH-assistant`), then `kestrel bench -p 512 -n 128 -d 512 --draft … --draft-k 3`
# (per k: draft, verify and round times in decode steps, the speedup they allow at acceptance
# 0.5–0.9, the measured speedup on the bench prompt), as a table, or with --json as JSON too;
# first the speculative tests on this GPU where kspec is carried (device drafts = host drafts,
# speculative = greedy).
#
# usage: bash tools/device/draft.sh [--no-tests] [--json] [ARCH ...]     (default: e2b e4b)
# Output: $OUT/draft.txt (and $OUT/draft-ARCH.json). Carry target/carry (pack.sh) and .gl.
set -uo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
tests=1 json=0 archs=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=0; shift ;;
    --json) json=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) archs+=("$1"); shift ;;
  esac
done
[ ${#archs[@]} -gt 0 ] || archs=(e2b e4b)
. tools/device/env.sh
F="$OUT/draft.txt"
gpu_info "$F"
have kestrel "$F" || exit 1
if [ $tests = 1 ] && have kspec "$F"; then
  echo "## speculative tests on this GPU (wgpu)" | tee -a "$F"
  KESTREL_REQUIRE_GPU=1 ./target/release/kspec wgpu_ --test-threads 1 2>&1 | grep -E "^test |test result|panicked" | tee -a "$F"
fi
for arch in "${archs[@]}"; do
  synth "$arch"
  synth "$arch-assistant"
  args=(--model "$MODELS/$arch" --draft "$MODELS/$arch-assistant" --draft-k 3 -p 512 -n 128 -d 512)
  echo "## $arch: kestrel bench ${args[*]}" | tee -a "$F"
  ./target/release/kestrel bench "${args[@]}" 2>&1 | tee -a "$F"
  [ $json = 1 ] && ./target/release/kestrel bench "${args[@]}" --json > "$OUT/draft-$arch.json" 2>> "$F"
  [ "$arch" = 26b-a4b ] && rm -rf "${MODELS:?}/$arch"
done
