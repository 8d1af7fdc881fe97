#!/usr/bin/env bash
# Session 15, after the final call (PERF_NOTES.md session 15 #4–#5): E2B's table run had taken
# its wall time at 7427 tok/s with a normal GPU time, so E2B again, this code and the base
# binary (2d51f3b, target/carry/kestrel_base.gz) and this code, -p 512 -n 8. ≈ 1 min on a warm
# machine. Carry target/carry (as session15-final.sh) and .gl. (Ran as a one-line command;
# saved here as it ran.)
. tools/device/env.sh; F=$OUT/e2b-rerun.txt; ./target/release/kestrel synth --arch e2b --quant 4bit /tmp/e2b > /dev/null 2>&1; for b in kestrel kestrel_base kestrel; do echo "== e2b $b" | tee -a $F; ./target/release/$b bench --model /tmp/e2b -p 512 -n 8 2>&1 | grep -E "^\| pp512 |GPU time of one 512|host|wall" | tee -a $F; done
