set -uo pipefail
. tools/device/env.sh
KB=./target/release/kbench; K=./target/release/kestrel
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv | tee $OUT/p1.txt
for cu in 2 1 4; do echo "== sweep CU=$cu" | tee -a $OUT/p1.txt; KESTREL_QMV_CU=$cu $KB qmv_q4_t1 --sweep 2>&1 | grep -v "^$" | tee -a $OUT/p1.txt; done
for f in copy rmsnorm qkv attention router qmm; do echo "== $f" | tee -a $OUT/p1.txt; $KB $f 2>&1 | grep -v "^$" | tee -a $OUT/p1.txt; done
$K synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1
echo "== e2b bench" | tee -a $OUT/p1.txt
$K bench --model /tmp/e2b -p 512 -n 128 2>&1 | tee -a $OUT/p1.txt
