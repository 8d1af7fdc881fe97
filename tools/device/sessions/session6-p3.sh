# Session 6, probe 3: the kernel tests on the H200 (the staged qmv and attention_split's merge
# by the last split to arrive, on a GPU whose workgroups run concurrently), the decode qmv sweep
# with the fitted rule, the decode latency table, then `kestrel bench` on the three archs.
# Carry target/release/{kestrel,kbench,ktests} and .gl (ktests: the tests/kernels.rs binary).
# (The merge was reverted after probe 4 measured it: PERF_NOTES.md, session 6.)
set -uo pipefail
. tools/device/env.sh
KB=./target/release/kbench; K=./target/release/kestrel
date | tee $OUT/p3.txt
echo "== tests/kernels.rs on the H200" | tee -a $OUT/p3.txt
KESTREL_REQUIRE_GPU=1 ./target/release/ktests 2>&1 | grep -E "^test |test result|FAIL|panicked" | tee -a $OUT/p3.txt
echo "== sweep CU=2" | tee -a $OUT/p3.txt
$KB qmv_q4_t --sweep 2>&1 | grep -v "^$" | tee -a $OUT/p3.txt
for f in copy rmsnorm attention; do echo "== $f" | tee -a $OUT/p3.txt; $KB $f 2>&1 | grep "^| [a-z]" | tee -a $OUT/p3.txt; done
for arch in e2b e4b 26b-a4b; do
  $K synth --arch $arch --quant 4bit /tmp/$arch > /dev/null 2>&1
  echo "== $arch" | tee -a $OUT/p3.txt
  $K bench --model /tmp/$arch -p 512 -n 128 2>&1 | tee -a $OUT/p3.txt
  rm -rf /tmp/$arch
done
