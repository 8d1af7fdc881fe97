#!/usr/bin/env bash
# Session 25, last call: the checks at the session's last code commit (fixtures, the 256 MiB
# mat-vec), then
# BENCHMARKS.md's table (`kestrel bench -p 512 -n 128` and the transformers peer, eager) with
# each new default's A/B on the same model between the two (TABLE_AB, -p 16 -n 128, one process
# per setting, off / on / off): E4B's norms by consumer kind (KESTREL_FUSE_NORMS=hidden the
# width rule). Between the checks and the table, a diagnostic for the next session: kbench's
# E4B decode mat-vecs with session 24's ceilings patch plus one new strip (kbenchx, built from
# tools/experiments/qmv-ceilings-session24.patch with `sbl2`: the scale/bias loads kept but all
# from the first 64 groups, L1/L2-resident), production / no scale-bias loads / sbl2: whether
# the scale/bias loads cost as loads or on the DRAM side. The kernel tests ran in p1 with these
# kernels (KTESTS=0). ≈ 8.5 min warm. Carry target/carry and .gl.
set -uo pipefail
. tools/device/env.sh
F="$OUT/final.txt"
KTESTS=0 final_checks "$F"
echo "== kbenchx: E4B decode mat-vecs, KESTREL_QMV_CEIL= / sb / sbl2 ($(date -u +%T))" | tee -a "$F"
for c in "" sb sbl2 ""; do
  echo "-- ceil=$c" | tee -a "$F"
  KESTREL_QMV_CEIL=$c KBENCH_SHAPES="E4B q|k|v,E4B down,E4B gate|up" timeout 90 ./target/release/kbenchx qmv_q4_t1 2>&1 | grep -E "^\| E4B .* qmv_q4_t1_|^copy|rror" | tee -a "$F"
done
P="tg128|decode step:|over [0-9]+ dispatches"
ab() {
  case $2 in
    e4b) V=KESTREL_FUSE_NORMS; OFF=hidden ;;
    *) return ;;
  esac
  for s in $OFF "" $OFF; do ab_bench "$1" $2 "-p 16 -n 128" "$P" $V=$s; done
}
TABLE_AB=ab
for arch in 26b-a4b e4b e2b; do
  table_row "$F" $arch
done
echo "== end ($(date -u +%T))" | tee -a "$F"
