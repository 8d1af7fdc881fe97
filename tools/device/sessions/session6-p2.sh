# Session 6, probe 2: the staged qmv (x in workgroup memory) — the decode sweep at CU 1/2/4,
# then `kestrel bench` on E2B/E4B/26B with staging on and off (KESTREL_QMV_STAGE=0), same binary.
set -uo pipefail
. tools/device/env.sh
KB=./target/release/kbench; K=./target/release/kestrel
date | tee $OUT/p2.txt
for cu in 2 1 4; do echo "== sweep CU=$cu staged" | tee -a $OUT/p2.txt; KESTREL_QMV_CU=$cu $KB qmv_q4_t1 --sweep 2>&1 | grep -v "^$" | tee -a $OUT/p2.txt; done
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  for st in 1 0; do
    echo "== $arch stage=$st" | tee -a $OUT/p2.txt
    KESTREL_QMV_STAGE=$st $K bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a $OUT/p2.txt
  done
  rm -rf /tmp/$arch
done
