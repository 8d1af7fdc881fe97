# Sourced by the tools/device scripts: the Vulkan loader on the H200 machine (the .debs carried
# in .gl/, see PERF_NOTES.md) and the NVIDIA ICD, then OUT (the folder that comes back).
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Binaries carried packed by tools/device/pack.sh (target/carry/*.gz) go to target/release/.
for f in target/carry/*.gz; do [ -e "$f" ] || continue; mkdir -p target/release; b=$(basename "$f" .gz); gunzip -c "$f" > "target/release/$b"; chmod +x "target/release/$b"; done
# One decode-only A/B run: `ab_run FILE ARCH [VAR=value …]` benches /tmp/ARCH (-p 16 -n 128) with
# those variables set and appends tg128, the step line and the mat-vec/norm rows of the
# per-dispatch profile to FILE.
ab_run() {
  local file=$1 arch=$2; shift 2
  echo "== $arch $*" | tee -a "$file"
  env "$@" ./target/release/kestrel bench --model /tmp/$arch -p 16 -n 128 2>&1 | grep -E "tg128|decode step:|^\| qmv_|^\| rmsnorm" | tee -a "$file"
}
# One A/B run with any bench arguments: `ab_bench FILE ARCH "BENCH ARGS" "GREP PATTERN" [VAR=value …]`
# benches /tmp/ARCH with those arguments and variables and appends the lines matching the pattern.
# `BIN=name ab_bench …` runs target/release/name instead of kestrel (a patched build carried
# beside it: pack-patch.sh).
ab_bench() {
  local file=$1 arch=$2 args=$3 pattern=$4; shift 4
  local bin=${BIN:-kestrel}
  echo "== $arch $*${BIN:+ ($bin)}" | tee -a "$file"
  env "$@" ./target/release/$bin bench --model /tmp/$arch $args 2>&1 | grep -E "$pattern" | tee -a "$file"
}
# A decode A/B of several settings: `tg_ab FILE "ARCHS" "GREP PATTERN" SETTING …` makes each
# synthetic 4-bit model, benches it (-p 16 -n 128: tg128 after a one-token context) once per
# setting in turn, AB_ROUNDS times (2), then removes it. A setting is one VAR=value, the label
# the output carries; KESTREL_DEFAULTS=1 (read by nothing) stands for the defaults.
tg_ab() {
  local file=$1 archs=$2 pattern=$3; shift 3
  for a in $archs; do
    ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
    for r in $(seq ${AB_ROUNDS:-2}); do
      for s in "$@"; do ab_bench "$file" $a "-p 16 -n 128" "$pattern" $s; done
    done
    rm -rf /tmp/$a
  done
}
# A prefill A/B of one switch on E2B, E4B and 26B (synthetic 4-bit models, made and removed here):
# `pp_ab FILE VAR "GREP PATTERN" [VAR2=value …]` benches -p 512 -n 8 with VAR=0, 1, 0, 1 per model
# (AB_VALUES="32 16 32 16" for other values; PP_ARCHS="e4b e2b" for other models).
pp_ab() {
  local file=$1 var=$2 pattern=$3; shift 3
  for a in ${PP_ARCHS:-e2b e4b 26b-a4b}; do
    ./target/release/kestrel synth --arch $a --quant 4bit /tmp/$a > /dev/null 2>&1
    for s in ${AB_VALUES:-0 1 0 1}; do
      ab_bench "$file" $a "-p 512 -n 8" "$pattern" $var=$s "$@"
    done
    rm -rf /tmp/$a
  done
}
# Session 14's tensor-core attention checks: `attn_ab FILE [VAR=value …]` appends the fixtures
# end to end, kbench's prefill attention rows and pp_ab of KESTREL_ATTN_COOP, each with the
# variables given.
attn_ab() {
  local file=$1; shift
  echo "== tests/fixtures.rs wgpu $*" | tee -a "$file"
  env "$@" KESTREL_REQUIRE_GPU=1 timeout 300 ./target/release/kfixtures wgpu 2>&1 | grep -E "test result|FAIL|differ|panicked" | tee -a "$file"
  echo "== kbench prefill attention $*" | tee -a "$file"
  env "$@" timeout 120 ./target/release/kbench attention 2>&1 | grep -E "^\| (E2B|E4B) " | tee -a "$file"
  pp_ab "$file" KESTREL_ATTN_COOP "^\| pp512 |GPU time of one 512|^\| attention_(d|coop)" "$@"
}
# What a final call checks first: `final_checks FILE` appends the GPU and its clocks, the kernel
# tests (with the ignored tensor-core ones; KTESTS=0 skips them, where an earlier call of the
# session ran them with the same kernels) and the fixtures end to end on this GPU, and kbench's
# 256 MiB mat-vec (the issue's single-kernel bar) to FILE.
final_checks() {
  local file=$1
  date -u | tee "$file"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$file"
  if [ "${KTESTS:-1}" != 0 ]; then
    echo "== tests/kernels.rs (incl. the ignored tensor-core tests: qmm_coop, attention_coop)" | tee -a "$file"
    KESTREL_REQUIRE_GPU=1 ./target/release/ktests --include-ignored 2>&1 | grep -E "^test |test result|FAIL|panicked" | head -40 | tee -a "$file"
  fi
  echo "== tests/fixtures.rs wgpu" | tee -a "$file"
  KESTREL_REQUIRE_GPU=1 ./target/release/kfixtures wgpu 2>&1 | grep -E "^test |test result|panicked|differ" | tee -a "$file"
  echo "== kbench 256 MiB" | tee -a "$file"
  KBENCH_SHAPES="256 MiB" ./target/release/kbench qmv_q4_t 2>&1 | grep -E "copy roofline|^\| 256" | tee -a "$file"
}
# One row of BENCHMARKS.md's table: `table_row FILE ARCH` makes /tmp/ARCH (`kestrel synth`,
# 4-bit), appends its `kestrel bench -p 512 -n 128` to FILE (printing the tg/pp and step lines),
# runs the transformers peer (eager) on the same config into $OUT/peer-ARCH.json, and removes
# the model. `TABLE_AB` (a function name), if set, runs between the bench and the peer with FILE
# and ARCH (a call's A/B on the same model).
table_row() {
  local file=$1 arch=$2
  date -u | tee -a "$file"
  ./target/release/kestrel synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch (default, ./target/release/kestrel)" | tee -a "$file"
  ./target/release/kestrel bench --model /tmp/$arch -p 512 -n 128 >> "$file" 2>&1
  grep -A3 "^| test" "$file" | tail -2
  grep -E "decode step:|GPU time of one 512" "$file" | tail -2
  if [ -n "${TABLE_AB:-}" ]; then "$TABLE_AB" "$file" $arch; fi
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --modes eager --json "$OUT/peer-$arch.json" 2>&1 | grep -E "transformers|model|Error|error" | tee -a "$file"
  rm -rf /tmp/$arch
}
