#!/usr/bin/env bash
# Session 36, p1: plain mat-vecs with x staged whole as integer digits (`with_x_digits`: E2B's and
# E4B's o projection and per-layer projection, which ran the float loop and read x once per
# team; `KESTREL_QMV_XDIGITS=1`, off by default) against the float loop (the defaults), E2B and
# E4B decode, alternating, two rounds, with the qmv rows of the timestamped profile and the
# verify table; kbench's rows of those shapes (held clock, the digits form beside the float
# one); the kernel cases on this GPU. Build: pack.sh --tests. Carry
# target/carry/{kestrel,kbench,ktests}.gz and .gl. ≈ 6 min warm.
set -uo pipefail
. tools/device/env.sh
F="$OUT/p1.txt"
date -u | tee "$F"; nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$F"
P="tg128|decode step:|^\| qmv_q4_t1_l(32_r1|8_r1|32_r2|8_r2)|^\| (2|3|4) \|"
tg_ab "$F" "${ARCHS:-e2b e4b}" "$P" KESTREL_DEFAULTS=1 KESTREL_QMV_XDIGITS=1
echo "== kbench ($(date -u +%T))" | tee -a "$F"
KBENCH_SHAPES="o_proj,per-layer" timeout 150 ./target/release/kbench qmv_q4_t 2>&1 | grep -E "copy roofline|o_proj|per-layer" | tee -a "$F"
echo "== kernel tests: every_kernel (qmv_xd cases), qmv_digit ($(date -u +%T))" | tee -a "$F"
KESTREL_REQUIRE_GPU=1 timeout 200 ./target/release/ktests every_kernel qmv_digit --nocapture 2>&1 | grep -E "qmv_xd|^test |test result|FAIL|panicked" | head -30 | tee -a "$F"
echo "== end ($(date -u +%T))" | tee -a "$F"
