#!/usr/bin/env bash
# Issue 5 on the H200: kestrel bench and its peer, Hugging Face transformers (bf16, eager and
# static cache + torch.compile; tools/peer/hf_bench.py), on the same full-size synthetic
# architecture in the same run. The peer builds the model from synth's config.json with random
# bf16 weights (it does not read the 4-bit weights). Needs the release binary at
# target/release/kestrel, the Vulkan loader .debs in .gl/ (see PERF_NOTES.md) and the machine's
# preinstalled torch + transformers. PEER_ARGS adds options to hf_bench.py (e.g. "--modes eager").
set -uo pipefail
. tools/device/env.sh
K=./target/release/kestrel
L="$OUT/peer.txt"
python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>&1 | tee -a "$L"
for arch in ${ARCHS:-e2b e4b}; do
  echo "== $arch" | tee -a "$L"
  $K synth --arch $arch --quant 4bit /tmp/$arch 2>&1 | tee -a "$L"
  $K bench --model /tmp/$arch -p 512 -n 128 --json > "$OUT/kestrel-$arch.json" 2>>"$L"
  python3 tools/peer/hf_bench.py --config /tmp/$arch/config.json -p 512 -n 128 --json "$OUT/peer-$arch.json" ${PEER_ARGS:-} 2>&1 | tee -a "$L"
  # One comparison line: kestrel's tg is decode after a 1-token context, as is the peer's tg_ctx1.
  python3 - "$OUT/kestrel-$arch.json" "$OUT/peer-$arch.json" <<'EOF' 2>&1 | tee -a "$L"
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
    row.append(f"transformers {m}: " + (f"error" if "error" in r else
               f"pp {f(r.get('pp_tok_s'))} tg@1 {f(r.get('tg_ctx1_tok_s'))} tg@{p.get('p')} {f(r.get('tg_tok_s'))} tok/s"))
print("summary: " + " | ".join(row))
EOF
  rm -rf /tmp/$arch
done
