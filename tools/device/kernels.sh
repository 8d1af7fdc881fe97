#!/usr/bin/env bash
# Single-kernel benchmarks (benches/kernels.rs) on the H200. Build first:
#   cargo bench --bench kernels --no-run && cp "$(ls -t target/release/deps/kernels-* | grep -v '\.d$' | head -1)" target/release/kbench
# then carry target/release/kbench and .gl (see PERF_NOTES.md).
set -uo pipefail
. tools/device/env.sh
./target/release/kbench "$@" 2>&1 | tee "$OUT/kernels.txt"
