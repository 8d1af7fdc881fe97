# Sourced by the tools/device scripts: the Vulkan loader on the H200 machine (the .debs carried
# in .gl/, see PERF_NOTES.md) and the NVIDIA ICD, then OUT (the folder that comes back).
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
