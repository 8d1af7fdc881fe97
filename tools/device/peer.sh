#!/usr/bin/env bash
# `kestrel bench` and its peer, Hugging Face transformers (tools/peer/hf_bench.py: bf16, eager,
# and static cache + torch.compile), on the same synthetic architecture on the same GPU. The peer
# builds the model from synth's config.json with random bf16 weights (it does not read the 4-bit
# weights) and needs the machine's torch and transformers. One summary line per model compares
# kestrel's tg (decode after a one-token context) with the peer's tg_ctx1.
# Output: $OUT/peer.txt, $OUT/kestrel-ARCH.json, $OUT/peer-ARCH.json.
#
# usage: bash tools/device/peer.sh [--modes eager,compile] [--hf "ARGS"] [ARCH ...]
#   ARCH      e2b, e4b, 26b-a4b (default: e2b e4b)
#   --modes   the peer's modes (default eager,compile; compile takes ≈ 2–3 minutes a model)
#   --hf      more hf_bench.py arguments ("--tg-ctx 1": only the tg after a one-token context)
# Carry target/carry/kestrel.gz and .gl.
set -uo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
modes=eager,compile hf= archs=()
while [ $# -gt 0 ]; do
  case $1 in
    --modes) modes=$2; shift 2 ;;
    --hf) hf=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) archs+=("$1"); shift ;;
  esac
done
[ ${#archs[@]} -gt 0 ] || archs=(e2b e4b)
. tools/device/env.sh
L="$OUT/peer.txt"
gpu_info "$L"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$L"
for arch in "${archs[@]}"; do
  echo "== $arch" | tee -a "$L"
  synth "$arch"
  ./target/release/kestrel bench --model "$MODELS/$arch" -p 512 -n 128 --json > "$OUT/kestrel-$arch.json" 2>> "$L"
  python3 tools/peer/hf_bench.py --config "$MODELS/$arch/config.json" -p 512 -n 128 --modes "$modes" $hf \
    --json "$OUT/peer-$arch.json" 2>&1 | tee -a "$L"
  python3 - "$OUT/kestrel-$arch.json" "$OUT/peer-$arch.json" << 'PY' 2>&1 | tee -a "$L"
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"error": str(e)}
k, p = load(sys.argv[1]), load(sys.argv[2])
f = lambda v: "-" if v is None else f"{v:.1f}"
row = [f"kestrel pp {f((k.get('pp') or {}).get('tok_s'))} tg {f((k.get('tg') or {}).get('tok_s'))} tok/s"]
for m, r in (p.get("modes") or {}).items():
    row.append(f"transformers {m}: " + ("error" if "error" in r else
               f"pp {f(r.get('pp_tok_s'))} tg@1 {f(r.get('tg_ctx1_tok_s'))} tg@{p.get('p')} {f(r.get('tg_tok_s'))} tok/s"))
print("summary: " + " | ".join(row))
PY
  rm -rf "${MODELS:?}/$arch"
done
echo "== end ($(date -u +%T))" | tee -a "$L"
