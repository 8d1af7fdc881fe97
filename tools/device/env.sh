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
ab_bench() {
  local file=$1 arch=$2 args=$3 pattern=$4; shift 4
  echo "== $arch $*" | tee -a "$file"
  env "$@" ./target/release/kestrel bench --model /tmp/$arch $args 2>&1 | grep -E "$pattern" | tee -a "$file"
}
