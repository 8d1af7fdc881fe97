# Sourced by the scripts in tools/device/, from the repository root on the machine with the GPU.
#
# 1. The Vulkan loader: the .debs in .gl/ (see README.md) unpacked over / when present, for
#    machines that have NVIDIA's driver but no libvulkan.
# 2. wgpu on Vulkan, pointed at NVIDIA's ICD where the image keeps it outside the loader's search
#    path (VK_DRIVER_FILES; set it yourself to override).
# 3. The binaries pack.sh left in target/carry/*.gz unpacked into target/release/.
# 4. OUT: the folder every script writes into (default /tmp/out), and MODELS: where the synthetic
#    checkpoints go (default /tmp/kestrel-models; the 26B-A4B one is 14 GB).
if compgen -G ".gl/*.deb" > /dev/null; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$icd" ]; then export VK_DRIVER_FILES=$icd; fi
for f in target/carry/*.gz; do
  [ -e "$f" ] || continue
  mkdir -p target/release
  b=$(basename "$f" .gz)
  gunzip -c "$f" > "target/release/$b" && chmod +x "target/release/$b"
done
OUT=${OUT:-/tmp/out}
MODELS=${MODELS:-/tmp/kestrel-models}
mkdir -p "$OUT" "$MODELS"

# `gpu_info FILE`: the date, the GPU, its driver and maximum clocks, appended to FILE.
gpu_info() {
  date -u | tee -a "$1"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$1"
  fi
}

# `synth ARCH`: the full-size 4-bit synthetic checkpoint of ARCH (e2b, e4b, 26b-a4b) in $MODELS,
# made once.
synth() {
  [ -e "$MODELS/$1/config.json" ] || ./target/release/kestrel synth --arch "$1" --quant 4bit "$MODELS/$1" > /dev/null
}

# `have BIN [FILE]`: whether target/release/BIN exists (carried or built); says so when it does
# not, and appends that to FILE.
have() {
  [ -x "target/release/$1" ] && return 0
  echo "(target/release/$1 not present: skipped)" | tee -a "${2:-/dev/null}"
  return 1
}
