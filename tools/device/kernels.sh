#!/usr/bin/env bash
# Single-kernel benchmarks (benches/kernels.rs) on the H200. Build first:
#   cargo bench --bench kernels --no-run && cp "$(ls -t target/release/deps/kernels-* | grep -v '\.d$' | head -1)" target/release/kbench
# then carry target/release/kbench and .gl (see PERF_NOTES.md).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan
./target/release/kbench "$@" 2>&1 | tee "$OUT/kernels.txt"
