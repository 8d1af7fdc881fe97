#!/usr/bin/env python3
"""Deterministic Gemma 4 oracle fixtures (tiny random-weight models).

Builds tiny text-only configs of the real Gemma 4 architectures with Hugging Face
transformers, saves them as HF-style folders (bf16 safetensors), runs greedy
generation in float32 as the reference, converts each to an MLX 4-bit affine
copy (mlx_lm.convert), checks a numpy re-implementation of MLX affine
quantization bit-for-bit, runs the transformers model again on the
dequantized 4-bit weights, and (where mlx runs) records MLX's own greedy run
of the 4-bit model.  Also builds a tiny Gemma-4-style tokenizer.json + chat
template and records encode/decode/chat-template cases.

Usage:  /work/oracle-venv/bin/python tools/oracle/make_fixtures.py [--only NAME ...] [--no-mlx] [--list]
Outputs go to $FIXTURES_OUT (default: out/ next to this script).  Everything is seeded; reruns reproduce the
same files.  With --only, the tokenizer and prompts are always rebuilt (every model folder carries a copy of the
tokenizer) and an existing manifest.json in the output folder keeps the entries of the fixtures not rebuilt.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file as np_save_file
from safetensors.numpy import load_file as np_load_file

import transformers
from transformers import (
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    GenerationConfig,
)

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("FIXTURES_OUT", HERE / "out"))

torch.set_num_threads(1)  # deterministic reductions; the models are tiny
torch.use_deterministic_algorithms(True)

VOCAB = 512
MAX_NEW_TOKENS = 48
SAVE_STEPS_SHORT = [0, 1, 2, 3, MAX_NEW_TOKENS - 1]  # steps kept for mlx's own runs (informational)

ROPE = {
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}

# Real Gemma 4 special token ids (see README: transformers config defaults + public Gemma 4 configs)
GEMMA4_SPECIAL_TOKENS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<|tool>": 46,
    "<tool|>": 47,
    "<|tool_call>": 48,
    "<tool_call|>": 49,
    "<|tool_response>": 50,
    "<tool_response|>": 51,
    '<|"|>': 52,
    "<|think|>": 98,
    "<|channel>": 100,
    "<channel|>": 101,
    "<|turn>": 105,
    "<turn|>": 106,
}
GEMMA4_NEWLINE_ID = 107  # "\n" is an ordinary token at id 107
GEMMA4_MULTIMODAL_IDS = {  # outside the tiny vocab; recorded only
    "<|image>": 255999,  # boi_token_id
    "<|audio>": 256000,  # boa_token_id
    "<|image|>": 258880,  # image_token_id
    "<|audio|>": 258881,  # audio_token_id
    "<image|>": 258882,  # eoi_token_id
    "<audio|>": 258883,  # eoa_token_id (config key eoa_token_index in transformers 5.24)
    "<|video|>": 258884,  # video_token_id
}
GEMMA4_EOS_IDS = [1, 106]

# --------------------------------------------------------------------------------------
# tiny configs
# --------------------------------------------------------------------------------------


def tiny_e2b():
    # real E2B: 35 layers [s,s,s,s,f]x7, hidden 1536, 8 heads, 1 kv head, head_dim 256 / global 512,
    # intermediate 6144 (x2 on the 20 kv-shared layers), PLE 256, window 512, softcap 30.
    L = 10
    return dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=None,
        sliding_window=16,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
        final_logit_softcapping=30.0,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=64,
        num_kv_shared_layers=5,
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        enable_moe_block=False,
        max_position_embeddings=4096,
        rope_parameters=copy.deepcopy(ROPE),
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def tiny_e4b():
    # real E4B: 42 layers [s x5, f]x7, hidden 2560, 8 heads, 2 kv heads, head_dim 256 / global 512,
    # intermediate 10240, 18 kv-shared layers, no double-wide MLP, PLE 256, window 512, softcap 30.
    L = 12
    return dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=None,
        sliding_window=16,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
        final_logit_softcapping=30.0,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=64,
        num_kv_shared_layers=6,
        use_double_wide_mlp=False,
        attention_k_eq_v=False,
        enable_moe_block=False,
        max_position_embeddings=4096,
        rope_parameters=copy.deepcopy(ROPE),
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def tiny_moe():
    # real 26B-A4B: 30 layers [s x5, f]x5, hidden 2816, 16 heads, 8 kv heads (sliding), 2 global kv heads,
    # head_dim 256 / global 512, attention_k_eq_v (full layers: V = K projection), dense MLP 2112 in
    # parallel with 128 experts (moe_intermediate 704) top-8, no PLE, no kv sharing, window 1024, softcap 30.
    L = 6
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        sliding_window=16,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        final_logit_softcapping=30.0,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        attention_k_eq_v=True,
        enable_moe_block=True,
        num_experts=16,
        top_k_experts=4,
        moe_intermediate_size=64,
        max_position_embeddings=4096,
        rope_parameters=copy.deepcopy(ROPE),
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def tiny_moe_k8():
    # tiny-moe variant with an untested MoE shape: 32 experts top-8 (the real 26B-A4B top-k), moe_intermediate 48
    # and dense intermediate 96 (neither a multiple of 64, so mlx_lm leaves those down projections unquantized
    # in mlx-4bit/), 7 layers [s s s f s s f] (two full layers, not last-only), sliding window 5.
    d = tiny_moe()
    d.update(
        intermediate_size=96,
        num_hidden_layers=7,
        sliding_window=5,
        layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
        final_logit_softcapping=30.0,
        num_experts=32,
        top_k_experts=8,
        moe_intermediate_size=48,
    )
    return d


def tiny_moe_e8():
    # tiny-moe variant: 8 experts top-2, moe_intermediate 32, dense 128, 4 layers [s s s f], 2 heads / 1 kv head
    # (global kv 1, k_eq_v), sliding window 7.
    d = tiny_moe()
    d.update(
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_global_key_value_heads=1,
        sliding_window=7,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
    )
    return d


def tiny_e2b_assistant_text():
    # real gemma-4-E2B-it-assistant text_config: hidden 256, 4 layers [s,s,s,f], 4 heads, 1 kv head,
    # head_dim 256 / global 512 (must match the target's KV), intermediate 2048, no PLE, no softcap,
    # num_kv_shared_layers == num_hidden_layers (all layers read the target's KV).
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=None,
        sliding_window=16,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        final_logit_softcapping=None,
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=4,
        use_double_wide_mlp=False,
        attention_k_eq_v=False,
        enable_moe_block=False,
        max_position_embeddings=4096,
        rope_parameters=copy.deepcopy(ROPE),
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def tiny_moe_assistant_text():
    # drafter for tiny-moe: its KV heads / head dims must match tiny-moe's 'store' layers (sliding: 2 kv heads x 32;
    # full: 1 kv head x 64, via attention_k_eq_v + num_global_key_value_heads as in the 26B-A4B target).
    d = tiny_e2b_assistant_text()
    d.update(hidden_size=64, intermediate_size=128, num_key_value_heads=2, num_global_key_value_heads=1,
             attention_k_eq_v=True)
    return d


NUM_ASSISTANT_TOKENS = 4
ASSISTANTS = {
    # random-weight drafter (realistic numerics; its drafts are essentially never accepted)
    "tiny-e2b-assistant": dict(
        target="tiny-e2b", text=tiny_e2b_assistant_text, seed=1004, mode="random",
        top=dict(backbone_hidden_size=128, use_ordered_embeddings=True, num_centroids=32, centroid_intermediate_top_k=4),
        real="google/gemma-4-E2B-it-assistant"),
    # 'copy' drafter (see copy_drafter_init_): its drafts repeat the last token, so they are accepted whenever the
    # (repetitive) tiny-moe greedy output repeats -> exercises full and partial acceptance in assisted decoding
    "tiny-moe-assistant": dict(
        target="tiny-moe", text=tiny_moe_assistant_text, seed=1005, mode="copy",
        top=dict(backbone_hidden_size=64, use_ordered_embeddings=True, num_centroids=32, centroid_intermediate_top_k=8),
        real="a 26B-A4B assistant (shape assumed to follow the E2B assistant)"),
}


MODELS = {
    "tiny-e2b": dict(text=tiny_e2b, seed=1001, real="google/gemma-4-E2B(-it)"),
    "tiny-e4b": dict(text=tiny_e4b, seed=1002, real="google/gemma-4-E4B(-it)"),
    "tiny-moe": dict(text=tiny_moe, seed=1003, real="google/gemma-4-26B-A4B(-it)"),
    # extra MoE shapes for the Rust MoE paths (no assistants)
    "tiny-moe-k8": dict(text=tiny_moe_k8, seed=1006, real="google/gemma-4-26B-A4B(-it) (other tiny MoE shape: 32 experts top-8)"),
    "tiny-moe-e8": dict(text=tiny_moe_e8, seed=1007, real="google/gemma-4-26B-A4B(-it) (other tiny MoE shape: 8 experts top-2)"),
}

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def log(*a):
    print(*a, flush=True)


def bf16_round_(module):
    """Round every saved float tensor (parameters and persistent buffers such as layer_scalar) to bf16.

    Non-persistent buffers (embed_scale, rotary inv_freq) are left alone: they are recomputed on load."""
    persistent = set(module.state_dict().keys())
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if name in persistent and t.dtype.is_floating_point:
                t.copy_(t.to(torch.bfloat16).to(t.dtype))


def realistic_init_(model, seed, hidden_size, ple_dim):
    """Replace the (std 0.02) init by realistic magnitudes, deterministically.

    * linear / expert weights: N(0, 1/fan_in)
    * embed_tokens: N(0, (4/sqrt(hidden))^2)  -> logits std ~4 before softcap
    * embed_tokens_per_layer: N(0, 1/ple_dim) -> unit RMS after the sqrt(ple_dim) scale
    * q_norm / k_norm weights: U(0.3, 0.5)  (sets the attention temperature, see below)
    * every other RMSNorm weight (used as-is, not 1+w, in Gemma 4): U(0.6, 1.4)
    * router.scale, router.per_expert_scale: U(0.5, 1.5)
    * layer_scalar buffers: U(0.3, 1.0)
    * assistant centroids N(0, 1/hidden); token_ordering: a random permutation of the vocab
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens_per_layer.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(ple_dim))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * (4.0 / math.sqrt(hidden_size)))
            elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                # Gemma 4 uses attention scaling 1.0 (no 1/sqrt(d)); q/k norm weights set the softmax temperature.
                # ~1.0 makes the random nets chaotic (f32 rounding noise grows ~4x per layer); 0.3-0.5 keeps
                # kernel-to-kernel differences ~1e-4 on the logits while the greedy output stays diverse.
                p.copy_(0.3 + 0.2 * torch.rand(p.shape, generator=g))
            elif p.dim() == 1:  # all remaining 1-D params are RMSNorm scales
                p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.3 + 0.7 * torch.rand(b.shape, generator=g))
            elif name.endswith("token_ordering"):
                b.copy_(torch.randperm(b.numel(), generator=g).to(b.dtype))


def real_style_text_config(text_cfg_dict, src):
    """config.json text_config in the form real checkpoints use (global_head_dim, not per_layer_config)."""
    d = dict(text_cfg_dict)
    d.pop("per_layer_config", None)
    for k in ("global_head_dim", "num_global_key_value_heads"):
        d[k] = src.get(k)
    return d


def file_size(p):
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")


def top2_margin(logits_row):
    v, _ = torch.topk(logits_row.float(), 2)
    return float(v[0] - v[1])


# --------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{%- macro strip_thinking(text) -%}"
    "{%- set ns = namespace(result='') -%}"
    "{%- for part in text.split('<channel|>') -%}"
    "{%- if '<|channel>' in part -%}{%- set ns.result = ns.result + part.split('<|channel>')[0] -%}"
    "{%- else -%}{%- set ns.result = ns.result + part -%}{%- endif -%}"
    "{%- endfor -%}"
    "{{- ns.result | trim -}}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- set loop_messages = messages -%}"
    "{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- '<|turn>system\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<|think|>\\n' -}}{%- endif -%}"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- messages[0]['content'] | trim -}}{%- set loop_messages = messages[1:] -%}"
    "{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if role == 'model' -%}{{- strip_thinking(message['content']) -}}"
    "{%- else -%}{{- message['content'] | trim -}}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)

WORDS = (
    "the a an of to and in is it that for on with as was at by be this from or have not are but "
    "model token layer window cache expert shared value key query head gemma tiny rust test weight "
    "quick brown fox jumps over lazy dog hello world how you today what time sliding full attention "
    "embedding per router scale norm logit greedy decode prompt turn system user answer think channel "
    "one two three four five six seven eight nine ten"
).split()


def training_text(n_sent=3000, seed=7):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n_sent):
        k = rng.randint(3, 12)
        ws = [WORDS[i] for i in rng.randint(0, len(WORDS), size=k)]
        if rng.rand() < 0.3:
            ws[0] = ws[0].capitalize()
        if rng.rand() < 0.2:
            ws.insert(rng.randint(0, len(ws)), str(rng.randint(0, 1000)))
        s = " ".join(ws) + [".", "?", "!", ","][rng.randint(0, 4)]
        out.append(s)
    return out


def build_tokenizer(out_dir):
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    # 1) train a small BPE whose pieces never cross a word boundary (sentencepiece style)
    tr = Tokenizer(BPE(unk_token=None, byte_fallback=False))
    tr.normalizer = normalizers.Replace(" ", "\u2581")
    tr.pre_tokenizer = pre_tokenizers.Split(pattern="\u2581", behavior="merged_with_next")
    n_fixed = 108 + 256  # ids 0..107 reserved/special/newline, 108..363 byte-fallback tokens
    n_learn = VOCAB - n_fixed
    trainer = trainers.BpeTrainer(vocab_size=n_learn, show_progress=False, special_tokens=[], limit_alphabet=80)
    tr.train_from_iterator(training_text(), trainer=trainer)
    tj = json.loads(tr.to_str())
    learned_vocab = tj["model"]["vocab"]
    merges = tj["model"]["merges"]
    learned = [t for t, _ in sorted(learned_vocab.items(), key=lambda kv: kv[1]) if t != "\n"]

    # 2) lay out the final vocab at fixed ids
    vocab = {}
    id_to_tok = {}
    for t, i in GEMMA4_SPECIAL_TOKENS.items():
        id_to_tok[i] = t
    id_to_tok[GEMMA4_NEWLINE_ID] = "\n"
    for i in range(108):
        if i not in id_to_tok:
            id_to_tok[i] = f"<unused{i}>"
    for b in range(256):
        id_to_tok[108 + b] = f"<0x{b:02X}>"
    nxt = n_fixed
    for t in learned:
        if nxt >= VOCAB:
            break
        id_to_tok[nxt] = t
        nxt += 1
    while nxt < VOCAB:
        id_to_tok[nxt] = f"<unused{nxt}>"
        nxt += 1
    vocab = {t: i for i, t in id_to_tok.items()}
    assert len(vocab) == VOCAB, len(vocab)
    # keep only merges whose parts/result are in the vocab
    def _mp(m):
        return m.split(" ") if isinstance(m, str) else list(m)
    merges = [tuple(_mp(m)) for m in merges]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and (m[0] + m[1]) in vocab]

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, dropout=None))
    # same pipeline as transformers' GemmaTokenizer: space->U+2581 normalizer, BPE with byte fallback
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = [t for t in id_to_tok.values() if t.startswith("<") and t.endswith(">") and not t.startswith("<0x")]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in sorted(specials, key=lambda t: vocab[t])])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1", special_tokens=[("<bos>", 2)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    tcfg = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "add_bos_token": True,
        "add_eos_token": False,
        "padding_side": "left",
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out_dir / "tokenizer_config.json", tcfg)
    with open(out_dir / "chat_template.jinja", "w") as f:
        f.write(CHAT_TEMPLATE)

    # 3) test cases via transformers' tokenizer (the same path a user of the HF folder takes)
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
    texts = [
        "hello world",
        "The quick brown fox jumps over the lazy dog.",
        "  leading and trailing spaces  ",
        "multi\nline\n\ntext",
        "numbers 12345 and 3.14",
        "caf\u00e9 na\u00efve \u2014 \u00fcber \u65e5\u672c \U0001f600",
        "<|turn>user\nHi<turn|>\n<|turn>model\n",
        "tokens <|channel>thought\nhidden<channel|>visible",
        "",
    ]
    enc_cases = []
    for t in texts:
        ids = hf_tok.encode(t, add_special_tokens=False)
        ids_sp = hf_tok.encode(t, add_special_tokens=True)
        enc_cases.append(
            dict(
                text=t,
                ids=ids,
                ids_with_special_tokens=ids_sp,
                tokens=hf_tok.convert_ids_to_tokens(ids),
                decoded=hf_tok.decode(ids, skip_special_tokens=False),
                decoded_skip_special=hf_tok.decode(ids, skip_special_tokens=True),
                tokenizers_lib_ids=tok.encode(t, add_special_tokens=False).ids,
            )
        )
    convs = [
        dict(messages=[{"role": "user", "content": "hello world"}], add_generation_prompt=True),
        dict(
            messages=[
                {"role": "system", "content": "You are a tiny test model."},
                {"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "<|channel>thought\nthink about time<channel|>It is ten."},
                {"role": "user", "content": "Thanks!"},
            ],
            add_generation_prompt=True,
        ),
        dict(messages=[{"role": "user", "content": "  how are you today  "}], add_generation_prompt=True, enable_thinking=True),
        dict(
            messages=[{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}],
            add_generation_prompt=False,
        ),
    ]
    chat_cases = []
    for c in convs:
        kw = {k: v for k, v in c.items() if k != "messages"}
        rendered = hf_tok.apply_chat_template(c["messages"], tokenize=False, **kw)
        ids = hf_tok.encode(rendered, add_special_tokens=False)
        chat_cases.append(dict(messages=c["messages"], kwargs=kw, rendered=rendered, ids=ids))
    write_json(
        out_dir / "tokenizer_tests.json",
        dict(
            note=(
                "ids = tokenizer.encode(text, add_special_tokens=False); ids_with_special_tokens adds the "
                "<bos> post-processor. Chat cases: rendered = apply_chat_template(messages, tokenize=False, **kwargs); "
                "ids = encode(rendered, add_special_tokens=False) (the template writes <bos> itself)."
            ),
            vocab_size=VOCAB,
            special_tokens=GEMMA4_SPECIAL_TOKENS,
            newline_id=GEMMA4_NEWLINE_ID,
            encode_cases=enc_cases,
            chat_cases=chat_cases,
        ),
    )
    return hf_tok


# --------------------------------------------------------------------------------------
# MLX affine quantization (numpy re-implementation, checked against mlx)
# --------------------------------------------------------------------------------------


def _round_half_even(x):
    # MLX's CPU affine quantizer rounds ties to even (checked bit-for-bit against mx.quantize)
    return np.rint(x)


def np_affine_quantize(w, group_size=64, bits=4):
    """MLX 'affine' quantization of the last axis.

    Returns (wq uint32 [..., in/ (32/bits)], scales f32 [..., in/group], biases f32 [..., in/group]).
    The caller casts scales/biases to the weight dtype (bf16 here); q is computed with the f32 values.
    Packing: 32/bits consecutive values per uint32, first value in the least-significant bits.
    """
    w = np.asarray(w, dtype=np.float32)
    shape = w.shape
    assert shape[-1] % group_size == 0
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    g = w.reshape(-1, shape[-1] // group_size, group_size)
    w_max = g.max(axis=-1, keepdims=True)
    w_min = g.min(axis=-1, keepdims=True)
    mask = np.abs(w_min) > np.abs(w_max)
    scales = np.maximum((w_max - w_min) / n_bins, eps).astype(np.float32)
    scales = np.where(mask, scales, -scales).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0 = _round_half_even(edge / scales).astype(np.float32)
    scales = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scales).astype(np.float32)
    biases = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    q = np.clip(_round_half_even((g - biases) / scales), 0, n_bins).astype(np.uint32)
    per = 32 // bits
    q = q.reshape(-1, shape[-1] // per, per)
    packed = np.zeros(q.shape[:-1], dtype=np.uint32)
    for i in range(per):
        packed |= q[..., i] << np.uint32(bits * i)
    return (
        packed.reshape(*shape[:-1], shape[-1] // per),
        scales.reshape(*shape[:-1], shape[-1] // group_size),
        biases.reshape(*shape[:-1], shape[-1] // group_size),
    )


def np_affine_dequantize(wq, scales, biases, group_size=64, bits=4):
    wq = np.asarray(wq, dtype=np.uint32)
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    vals = np.stack([(wq >> np.uint32(bits * i)) & mask for i in range(per)], axis=-1)
    vals = vals.reshape(*wq.shape[:-1], wq.shape[-1] * per).astype(np.float32)
    n_in = vals.shape[-1]
    s = np.repeat(np.asarray(scales, np.float32), group_size, axis=-1)[..., :n_in]
    b = np.repeat(np.asarray(biases, np.float32), group_size, axis=-1)[..., :n_in]
    return vals * s + b


def load_safetensors_f32(path):
    """Load a safetensors file into float32 numpy (bf16 handled through torch)."""
    from safetensors.torch import load_file as t_load

    out = {}
    for k, v in t_load(str(path)).items():
        if v.dtype.is_floating_point:
            out[k] = v.to(torch.float32).numpy()
        else:
            out[k] = v.numpy()
    return out


# --------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------


def make_prompts(hf_tok):
    rng = np.random.RandomState(1234)
    chat = hf_tok.apply_chat_template(
        [{"role": "user", "content": "hello world, how are you today?"}], tokenize=False, add_generation_prompt=True
    )
    p0 = hf_tok.encode(chat, add_special_tokens=False)
    p1 = [2] + rng.randint(108, VOCAB, size=7).tolist()
    p2 = [2] + rng.randint(108, VOCAB, size=39).tolist()
    return [
        dict(name="chat", ids=p0, text=chat),
        dict(name="short", ids=p1),
        dict(name="long", ids=p2, note="40 tokens > 2x sliding_window (16)"),
    ]


# --------------------------------------------------------------------------------------
# reference runs
# --------------------------------------------------------------------------------------


def greedy_generate(model, ids, max_new_tokens=MAX_NEW_TOKENS, assistant=None):
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=2,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=True,
    )
    inp = torch.tensor([ids], dtype=torch.long)
    # generate() fills unset fields from model.generation_config (eos [1, 106] from generation_config.json):
    # clear it so every run produces exactly max_new_tokens tokens.
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        if assistant is None:
            out = model.generate(inp, generation_config=gc)
        else:
            out = model.generate(inp, generation_config=gc, assistant_model=assistant)
    gen = out.sequences[0, len(ids):].tolist()
    logits = torch.cat([l.float() for l in out.logits], dim=0) if out.logits is not None else None
    return gen, logits


def run_reference(model, prompts, tag, hidden=True):
    """Greedy generation + prompt forward (logits of every prompt row, and with `hidden` its hidden states) +
    no-cache consistency check.  Every step's logits are kept: a test that compares only some steps, or no
    prompt rows, cannot see an error that shows on the others."""
    tensors = {}
    summary = []
    for i, p in enumerate(prompts):
        ids = p["ids"]
        t0 = time.time()
        gen, step_logits = greedy_generate(model, ids)
        dt = time.time() - t0
        margins = [top2_margin(step_logits[s]) for s in range(step_logits.shape[0])]
        # no-cache forward over the whole sequence (prompt + generated[:-1]) as a consistency check
        seq = torch.tensor([ids + gen[:-1]], dtype=torch.long)
        with torch.no_grad():
            nc = model(input_ids=seq, use_cache=False).logits[0].float()
        nc_steps = nc[len(ids) - 1 :]
        nc_argmax = nc_steps.argmax(-1).tolist()
        impl0 = model.config._attn_implementation
        outs = {}
        for impl in ("sdpa", "eager"):
            model.config._attn_implementation = impl
            model.get_decoder().config._attn_implementation = impl
            with torch.no_grad():
                outs[impl] = model(input_ids=seq, use_cache=False).logits[0].float()
        model.config._attn_implementation = impl0
        model.get_decoder().config._attn_implementation = impl0
        sens = float((outs["sdpa"] - outs["eager"]).abs().max())
        entry = dict(
            prompt=p["name"],
            max_abs_diff_sdpa_vs_eager_logits=sens,
            eos_positions_in_generated=[j for j, t in enumerate(gen) if t in GEMMA4_EOS_IDS],
            prompt_len=len(ids),
            prompt_ids=ids,
            generated_ids=gen,
            min_top2_margin=min(margins),
            argmin_top2_margin_step=int(np.argmin(margins)),
            top2_margins=[round(m, 5) for m in margins],
            nocache_argmax_matches_generated=(nc_argmax == gen),
            max_abs_diff_cached_vs_nocache_logits=float((nc_steps - step_logits).abs().max()),
            generate_seconds=round(dt, 3),
        )
        tensors[f"p{i}.prompt_ids"] = np.asarray(ids, dtype=np.int64)
        tensors[f"p{i}.generated_ids"] = np.asarray(gen, dtype=np.int64)
        tensors[f"p{i}.step_logits"] = step_logits.numpy().astype(np.float32)
        with torch.no_grad():
            fw = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
        tensors[f"p{i}.prompt_logits"] = fw.logits[0].float().numpy()
        if hidden:
            hs = getattr(fw, "hidden_states", None)
            tensors[f"p{i}.prompt_hidden_states"] = torch.stack([h[0].float() for h in hs]).numpy()
        summary.append(entry)
        log(f"   [{tag}] {p['name']}: len {len(ids)} -> {gen[:12]}... min margin {min(margins):.4f} "
            f"nocache-consistent={entry['nocache_argmax_matches_generated']} ({dt:.2f}s)")
    return tensors, summary


# --------------------------------------------------------------------------------------
# model building / saving
# --------------------------------------------------------------------------------------


def build_target(name):
    spec = MODELS[name]
    src = spec["text"]()
    tc = {k: v for k, v in src.items()}
    cfg = Gemma4Config(text_config=tc, vision_config=None, audio_config=None)
    torch.manual_seed(spec["seed"])
    model = Gemma4ForConditionalGeneration(cfg).eval()
    realistic_init_(model, spec["seed"], src["hidden_size"], src["hidden_size_per_layer_input"] or 1)
    bf16_round_(model)
    return model, src


def save_hf_folder(model, src, folder, tok_dir, kind="target"):
    folder.mkdir(parents=True, exist_ok=True)
    # weights: bf16, tied lm_head dropped (like the real checkpoints)
    from safetensors.torch import save_file as t_save

    sd = model.state_dict()
    tensors = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue
        v = v.detach().contiguous()
        if v.dtype.is_floating_point:
            v = v.to(torch.bfloat16)
        tensors[k] = v
    t_save(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfgd = model.config.to_dict()
    cfgd["dtype"] = "bfloat16"
    if kind == "target":
        cfgd["architectures"] = ["Gemma4ForConditionalGeneration"]
        cfgd["text_config"] = real_style_text_config(cfgd["text_config"], src)
        cfgd["eos_token_id"] = GEMMA4_EOS_IDS
        cfgd["pad_token_id"] = 0
        cfgd["bos_token_id"] = 2
        cfgd["vocab_size"] = src["vocab_size"]  # mlx_lm reads the top-level vocab_size for model_type gemma4
    else:
        cfgd["architectures"] = ["Gemma4AssistantForCausalLM"]
        cfgd["text_config"] = real_style_text_config(cfgd["text_config"], src)
    for k in ("transformers_version",):
        cfgd.pop(k, None)
    cfgd["transformers_version"] = transformers.__version__
    write_json(folder / "config.json", cfgd)
    gen = {"bos_token_id": 2, "eos_token_id": GEMMA4_EOS_IDS, "pad_token_id": 0}
    if kind == "assistant":
        gen.update(num_assistant_tokens=NUM_ASSISTANT_TOKENS, num_assistant_tokens_schedule="constant")
    write_json(folder / "generation_config.json", gen)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tok_dir / f, folder / f)


def reload_target(folder):
    m = Gemma4ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    return m


def check_same(m_a, m_b, ids):
    with torch.no_grad():
        a = m_a(input_ids=torch.tensor([ids])).logits
        b = m_b(input_ids=torch.tensor([ids])).logits
    return float((a - b).abs().max())


# --------------------------------------------------------------------------------------
# MLX conversion + checks
# --------------------------------------------------------------------------------------


def try_import_mlx():
    try:
        import mlx.core as mx  # noqa
        import mlx_lm  # noqa

        w = mx.random.normal((8, 64), key=mx.random.key(0))
        wq, s, b = mx.quantize(w, group_size=64, bits=4)
        y = mx.quantized_matmul(mx.ones((1, 64)), wq, s, b, transpose=True, group_size=64, bits=4)
        mx.eval(y)
        return True, None
    except Exception as e:  # pragma: no cover
        return False, repr(e)


def mlx_convert(hf_folder, mlx_folder):
    from mlx_lm import convert

    if mlx_folder.exists():
        shutil.rmtree(mlx_folder)
    convert(str(hf_folder), str(mlx_folder), quantize=True, q_group_size=64, q_bits=4)


def check_numpy_quant_against_mlx(hf_folder, mlx_folder, tensor_map):
    """For every quantized tensor in the MLX folder, requantize the bf16 source with numpy and compare bits."""
    import mlx.core as mx

    src = load_safetensors_f32(hf_folder / "model.safetensors")
    q = mx.load(str(mlx_folder / "model.safetensors"))
    cfg = json.load(open(mlx_folder / "config.json"))
    qcfg = cfg.get("quantization", {})
    n_ok = n_bad = 0
    bad = []
    for k in sorted(q.keys()):
        if not k.endswith(".scales"):
            continue
        base = k[: -len(".scales")]
        wq = np.array(q[base + ".weight"])
        sc = np.array(q[base + ".scales"].astype(mx.float32))
        bi = np.array(q[base + ".biases"].astype(mx.float32))
        gs = qcfg.get(base, {}).get("group_size", qcfg.get("group_size", 64)) if isinstance(qcfg.get(base), dict) else qcfg.get("group_size", 64)
        bits = qcfg.get(base, {}).get("bits", qcfg.get("bits", 4)) if isinstance(qcfg.get(base), dict) else qcfg.get("bits", 4)
        w_src = tensor_map(base, src)
        if w_src is None:
            continue
        pq, ps, pb = np_affine_quantize(w_src, gs, bits)
        ps_bf = torch.from_numpy(ps).to(torch.bfloat16).float().numpy()
        pb_bf = torch.from_numpy(pb).to(torch.bfloat16).float().numpy()
        same = np.array_equal(pq, wq) and np.array_equal(ps_bf, sc) and np.array_equal(pb_bf, bi)
        if same:
            n_ok += 1
        else:
            n_bad += 1
            bad.append(dict(tensor=base, packed_mismatch=int((pq != wq).sum()), scale_mismatch=int((ps_bf != sc).sum()),
                            bias_mismatch=int((pb_bf != bi).sum())))
    return dict(tensors_bit_exact=n_ok, tensors_mismatch=n_bad, mismatches=bad[:10])


def mlx_unquantized_weights(mlx_folder):
    """mlx tensors with >= 2 dims that mlx_lm left in bf16 (last dim not a multiple of the group size)."""
    from safetensors import safe_open

    with safe_open(str(mlx_folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        return sorted(k for k in keys if k.endswith(".weight") and k[: -len(".weight")] + ".scales" not in keys
                      and len(f.get_slice(k).get_shape()) >= 2)


def mlx_to_hf_source(base, src):
    """Map an mlx_lm tensor base name back to the bf16 source weight (HF naming)."""
    # mlx: language_model.model.X -> hf: model.language_model.X ; experts.switch_glu.{gate,up,down}_proj
    if not base.startswith("language_model.model."):
        return None
    rest = base[len("language_model.model."):]
    if ".experts.switch_glu." in rest:
        layer, which = rest.split(".experts.switch_glu.")
        which = which.split(".")[0]
        if which in ("gate_proj", "up_proj"):
            gu = src[f"model.language_model.{layer}.experts.gate_up_proj"]
            half = gu.shape[-2] // 2
            return gu[..., :half, :] if which == "gate_proj" else gu[..., half:, :]
        return src[f"model.language_model.{layer}.experts.down_proj"]
    return src.get(f"model.language_model.{rest}.weight", src.get(f"model.language_model.{rest}"))


def dequantized_hf_state(mlx_folder, model):
    """Dequantize the MLX folder (numpy) into an HF state dict for `model` (float32)."""
    import mlx.core as mx

    q = mx.load(str(mlx_folder / "model.safetensors"))
    cfg = json.load(open(mlx_folder / "config.json"))
    qcfg = cfg.get("quantization", {})
    flat = {}
    for k, v in q.items():
        flat[k] = v
    deq = {}
    for k in flat:
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else k
        if base + ".scales" in flat:
            lc = qcfg.get(base) if isinstance(qcfg.get(base), dict) else {}
            gs = lc.get("group_size", qcfg.get("group_size", 64))
            bits = lc.get("bits", qcfg.get("bits", 4))
            w = np_affine_dequantize(
                np.array(flat[k]),
                np.array(flat[base + ".scales"].astype(mx.float32)),
                np.array(flat[base + ".biases"].astype(mx.float32)),
                gs,
                bits,
            )
        else:
            w = np.array(flat[k].astype(mx.float32)) if flat[k].dtype in (mx.bfloat16, mx.float16, mx.float32) else np.array(flat[k])
        deq[k] = w
    # rename to HF
    sd = {}
    for k, w in deq.items():
        assert k.startswith("language_model.model."), k
        rest = k[len("language_model.model."):]
        if ".experts.switch_glu." in rest:
            layer, tail = rest.split(".experts.switch_glu.")
            which = tail.split(".")[0]
            if which == "down_proj":
                sd[f"model.language_model.{layer}.experts.down_proj"] = w
            else:
                sd.setdefault(f"__gu__{layer}", {})[which] = w
            continue
        sd[f"model.language_model.{rest}"] = w
    for k in [k for k in sd if k.startswith("__gu__")]:
        layer = k[len("__gu__"):]
        d = sd.pop(k)
        sd[f"model.language_model.{layer}.experts.gate_up_proj"] = np.concatenate([d["gate_proj"], d["up_proj"]], axis=-2)
    ref = model.state_dict()
    out = {}
    for k, v in ref.items():
        if k == "lm_head.weight":
            continue
        if k not in sd:
            raise KeyError(f"missing {k} in dequantized mlx weights")
        t = torch.from_numpy(np.ascontiguousarray(sd[k])).to(v.dtype).reshape(v.shape)
        out[k] = t
    extra = set(sd) - set(ref)
    return out, sorted(extra)


def mlx_greedy(mlx_folder, prompts, dtype_name):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _tok = load(str(mlx_folder))
    if dtype_name == "float32":
        model.set_dtype(mx.float32)
    tensors, summary = {}, []
    for i, p in enumerate(prompts):
        cache = make_prompt_cache(model)
        x = mx.array([p["ids"]])
        toks, rows = [], []
        for step in range(MAX_NEW_TOKENS):
            logits = model(x, cache=cache)[:, -1, :].astype(mx.float32)
            mx.eval(logits)
            row = np.array(logits[0])
            t = int(np.argmax(row))
            toks.append(t)
            rows.append(row)
            x = mx.array([[t]])
        rows = np.stack(rows)
        margins = [float(np.sort(r)[-1] - np.sort(r)[-2]) for r in rows]
        tensors[f"p{i}.generated_ids"] = np.asarray(toks, dtype=np.int64)
        tensors[f"p{i}.step_logits_sel"] = rows[SAVE_STEPS_SHORT].astype(np.float32)
        summary.append(dict(prompt=p["name"], generated_ids=toks, min_top2_margin=min(margins)))
    return tensors, summary


# --------------------------------------------------------------------------------------
# assistant
# --------------------------------------------------------------------------------------


def build_assistant(name):
    spec = ASSISTANTS[name]
    src = spec["text"]()
    acfg = Gemma4AssistantConfig(text_config=dict(src), **spec["top"])
    torch.manual_seed(spec["seed"])
    a = Gemma4AssistantForCausalLM(acfg).eval()
    realistic_init_(a, spec["seed"], src["hidden_size"], 1)
    bf16_round_(a)
    a.generation_config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
    a.generation_config.num_assistant_tokens_schedule = "constant"
    return a, src


def copy_drafter_init_(target, a, seed, n_seqs=48, steps=500, lr=1e-2, alpha=30.0):
    """Turn the random assistant into a 'copy' drafter, deterministically.

    1. (assistant hidden == backbone hidden) pre_projection += alpha*[0 | I] routes the target hidden h_t
       straight through the residual stream; post_projection := I + 0.1*random; the assistant's tied
       embedding/lm_head := the target's embedding; final norm weight := 1.  Since h_t is the state that
       predicted x_{t+1} = argmax(E h_t) and the drafter is fed [embed(x_{t+1}), h_t], its drafts are ~x_{t+1},
       i.e. a repeat of the last token (accepted whenever the target repeats itself).
    2. Fit the centroid head (cross-entropy) so that the cluster of the drafter's own full-vocab argmax is among
       its top-k clusters, on features from target greedy continuations of random prompts.
    All other weights keep their random realistic init.
    """
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    hb = a.backbone_hidden_size
    assert a.hidden_size == hb
    with torch.no_grad():
        a.pre_projection.weight[:, hb:] += alpha * torch.eye(hb)
        a.post_projection.weight.copy_(torch.eye(hb) + 0.1 * a.post_projection.weight)
        a.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        a.model.norm.weight.fill_(1.0)
    bf16_round_(a)
    rng = np.random.RandomState(seed)
    emb = target.get_input_embeddings()
    tcfg = a.config.get_text_config()
    feats = []
    for _ in range(n_seqs):
        plen = int(rng.randint(4, 24))
        prompt = [2] + rng.randint(108, VOCAB, size=plen - 1).tolist()
        gen, _ = greedy_generate(target, prompt, max_new_tokens=40)
        seq = torch.tensor([prompt + gen])
        Tm = seq.shape[1] - 1
        idx = torch.arange(Tm).unsqueeze(0)
        with torch.no_grad():
            o = target(input_ids=seq, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
            x = a.pre_projection(torch.cat([emb(seq[:, 1:]), o.hidden_states[-1][:, :-1]], -1))
            # query i (position id i+1) sees target KV 0..i, like a single-position drafting call
            masks = {
                "full_attention": create_causal_mask(tcfg, x, None, None, idx),
                "sliding_attention": create_sliding_window_causal_mask(tcfg, x, None, None, idx),
            }
            kv = {k: (v[0][:, :, :Tm], v[1][:, :, :Tm]) for k, v in o.shared_kv_states.items()}
            out = a.model(inputs_embeds=x, attention_mask=masks, position_ids=idx + 1, shared_kv_states=kv,
                          use_cache=False, output_hidden_states=True)  # (also avoids an HF slicing path that assumes PLE)
        feats.append(out.last_hidden_state[0])
    H = torch.cat(feats)
    with torch.no_grad():
        Y = a.lm_head(H).argmax(-1)
    me = a.masked_embedding
    vpc = me.vocab_size // me.num_centroids
    cluster_of = torch.empty(me.vocab_size, dtype=torch.long)
    cluster_of[me.token_ordering.long()] = torch.arange(me.vocab_size) // vpc
    W = torch.nn.Parameter(me.centroids.weight.detach().clone())
    opt = torch.optim.Adam([W], lr=lr)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(H @ W.T, cluster_of[Y])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        me.centroids.weight.copy_(W.detach())
    bf16_round_(a)
    with torch.no_grad():
        top = (H @ me.centroids.weight.T).topk(me.centroid_intermediate_top_k, -1).indices
        recall = float((top == cluster_of[Y][:, None]).any(-1).float().mean())
    return dict(mode="copy", alpha=alpha, n_seqs=n_seqs, centroid_fit_steps=steps, lr=lr,
                centroid_loss_first=round(losses[0], 4), centroid_loss_last=round(losses[-1], 4),
                centroid_topk_recall_of_own_argmax=round(recall, 3))


@torch.no_grad()
def drafter_trace(target, assistant, ids, n_steps=NUM_ASSISTANT_TOKENS):
    """First drafting round after prefill, replicating transformers' SinglePositionMultiTokenCandidateGenerator.

    After the target's prefill over the prompt (length L) the target emits x_L = argmax(logits[L-1]). The drafter
    then runs n_steps times at the constant position id L with
      inputs_embeds = concat(target.embed_tokens(x) * sqrt(hidden), h)   (backbone hidden each, 2*H_b total)
    where for step 0 x = x_L and h = target final (normed) hidden state at position L-1, and for later steps
    x = previous drafted token and h = previous step's post_projection output; K/V = target's shared KV
    (last 'store' layer of each attention type) for positions 0..L-1.
    """
    L = len(ids)
    inp = torch.tensor([ids])
    out = target(input_ids=inp, use_cache=True, output_hidden_states=True, return_shared_kv_states=True)
    x_L = int(out.logits[0, -1].argmax())
    cur_len = L + 1  # input_ids now include x_L
    shared = {k: (v[0][:, :, :cur_len], v[1][:, :, :cur_len]) for k, v in out.shared_kv_states.items()}
    h = out.hidden_states[-1][:, -1:]
    emb = target.get_input_embeddings()
    last_tok = torch.tensor([[x_L]])
    pos = torch.tensor([[cur_len - 1]])
    t = {"target_last_hidden": h[0, 0].float().numpy()}
    for k, (kk, vv) in shared.items():
        t[f"shared_kv.{k}.key"] = kk[0].float().numpy()
        t[f"shared_kv.{k}.value"] = vv[0].float().numpy()
    steps = []
    for s_ in range(n_steps):
        x = torch.cat([emb(last_tok), h], dim=-1)
        o = assistant(inputs_embeds=x, position_ids=pos, shared_kv_states=shared, use_cache=False)
        tok = int(o.logits[0, -1].argmax())
        t[f"step{s_}.inputs_embeds"] = x[0, 0].float().numpy()
        t[f"step{s_}.logits"] = o.logits[0, -1].float().numpy()
        t[f"step{s_}.projected_hidden"] = o.last_hidden_state[0, -1].float().numpy()
        steps.append(dict(step=s_, input_token=int(last_tok[0, 0]), drafted_token=tok, position_id=cur_len - 1))
        last_tok = torch.tensor([[tok]])
        h = o.last_hidden_state
    return t, dict(prompt_len=L, target_first_token=x_L, steps=steps,
                   shared_kv_shapes={k: list(v[0].shape) for k, v in shared.items()})


def assisted_generation_log(target, assistant, ids):
    from transformers.generation import candidate_generator as cg

    cls = cg.SinglePositionMultiTokenCandidateGenerator
    rounds = []
    orig_get = cls.get_candidates
    orig_upd = cls.update_candidate_strategy

    def get_c(self, input_ids, *a, **k):
        cand, logits = orig_get(self, input_ids, *a, **k)
        rounds.append(dict(context_len=int(input_ids.shape[1]), drafted=cand[0, input_ids.shape[1]:].tolist()))
        return cand, logits

    def upd(self, input_ids, scores, num_matches):
        if rounds:
            rounds[-1]["num_accepted"] = int(num_matches)
        return orig_upd(self, input_ids, scores, num_matches)

    cls.get_candidates = get_c
    cls.update_candidate_strategy = upd
    try:
        gen, _ = greedy_generate(target, ids, assistant=assistant)
    finally:
        cls.get_candidates = orig_get
        cls.update_candidate_strategy = orig_upd
    return gen, [r for r in rounds if r["drafted"]]


def quantize_assistant_numpy(folder_hf, folder_q):
    """MLX-format 4-bit copy of the assistant made with the numpy quantizer (mlx_lm has no gemma4_assistant)."""
    folder_q.mkdir(parents=True, exist_ok=True)
    src = load_safetensors_f32(folder_hf / "model.safetensors")
    out = {}
    qinfo = {}
    for k, v in src.items():
        quantizable = v.ndim == 2 and k.endswith(".weight") and ("norm" not in k) and v.shape[-1] % 64 == 0
        if quantizable:
            base = k[: -len(".weight")]
            wq, s, b = np_affine_quantize(v, 64, 4)
            out[base + ".weight"] = wq
            out[base + ".scales"] = s
            out[base + ".biases"] = b
            qinfo[base] = True
        else:
            out[k] = v
    from safetensors.torch import save_file as t_save

    tt = {}
    for k, v in out.items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        if t.dtype == torch.float32:
            t = t.to(torch.bfloat16)
        tt[k] = t
    t_save(tt, str(folder_q / "model.safetensors"), metadata={"format": "mlx"})
    cfg = json.load(open(folder_hf / "config.json"))
    cfg["quantization"] = {"group_size": 64, "bits": 4, "mode": "affine"}
    write_json(folder_q / "config.json", cfg)
    shutil.copy(folder_hf / "generation_config.json", folder_q / "generation_config.json")
    return sorted(qinfo)


def dequant_assistant_state(folder_q, a):
    from safetensors.torch import load_file as t_load

    raw = t_load(str(folder_q / "model.safetensors"))
    sd = {}
    for k, v in raw.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in raw:
            w = np_affine_dequantize(v.numpy(), raw[base + ".scales"].float().numpy(), raw[base + ".biases"].float().numpy())
            sd[k] = torch.from_numpy(w)
        else:
            sd[k] = v.float() if v.dtype.is_floating_point else v
    ref = a.state_dict()
    out = {k: sd[k].to(ref[k].dtype).reshape(ref[k].shape) for k in ref if k != "lm_head.weight"}
    return out


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-mlx", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the fixture names and exit")
    args = ap.parse_args()
    known = list(MODELS) + list(ASSISTANTS)
    if args.list:
        print("\n".join(known))
        return
    if args.only is not None:
        unknown = [n for n in args.only if n not in known]
        if unknown:
            ap.error(f"unknown fixture(s) {unknown}; known: {known}")
        for n in args.only:  # an assistant needs its target built in the same run
            if n in ASSISTANTS and ASSISTANTS[n]["target"] not in args.only:
                ap.error(f"{n} needs its target: add {ASSISTANTS[n]['target']} to --only")
    t_all = time.time()
    OUT.mkdir(exist_ok=True)
    manifest = dict(
        versions=dict(
            python=sys.version.split()[0],
            torch=torch.__version__,
            transformers=transformers.__version__,
            numpy=np.__version__,
        ),
        fixtures={},
    )
    mlx_ok, mlx_err = (False, "disabled by --no-mlx") if args.no_mlx else try_import_mlx()
    if mlx_ok:
        import mlx.core as mx
        import mlx_lm

        manifest["versions"].update(mlx=mx.__version__, mlx_lm=mlx_lm.__version__)
    manifest["mlx_available"] = mlx_ok
    manifest["mlx_error"] = mlx_err
    log(f"mlx available: {mlx_ok} {mlx_err or ''}")

    # tokenizer
    t0 = time.time()
    tok_dir = OUT / "tokenizer"
    hf_tok = build_tokenizer(tok_dir)
    manifest["tokenizer"] = dict(path="out/tokenizer", seconds=round(time.time() - t0, 2), bytes=file_size(tok_dir))
    prompts = make_prompts(hf_tok)
    write_json(OUT / "prompts.json", prompts)
    log(f"tokenizer built; prompts: {[len(p['ids']) for p in prompts]}")

    names = [n for n in MODELS if args.only is None or n in args.only]
    targets = {}
    for name in names:
        t0 = time.time()
        log(f"== {name}")
        fdir = OUT / name
        if fdir.exists():
            shutil.rmtree(fdir)
        hf_dir = fdir / "hf"
        ref_dir = fdir / "ref"
        ref_dir.mkdir(parents=True)
        model, src = build_target(name)
        save_hf_folder(model, src, hf_dir, tok_dir)
        m = reload_target(hf_dir)
        diff = check_same(model, m, prompts[2]["ids"])
        assert diff == 0.0, f"reloaded model differs: {diff}"
        targets[name] = m
        info = dict(real_counterpart=MODELS[name]["real"], text_config=src,
                    num_params=int(sum(p.numel() for p in m.parameters()) - m.lm_head.weight.numel()),
                    kv_sharing_modes=m.config.get_text_config().kv_sharing_modes)

        # f32 reference
        tensors, summary = run_reference(m, prompts, "f32")
        np_save_file(tensors, str(ref_dir / "reference.safetensors"))
        write_json(ref_dir / "reference.json", dict(
            what="transformers float32 compute on the bf16 weights in hf/; greedy, use_cache=True, EOS not stopping",
            prompts=summary))
        # bf16 compute (informational)
        mb = Gemma4ForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch.bfloat16).eval()
        bf_ids = [greedy_generate(mb, p["ids"])[0] for p in prompts]
        info["bf16_compute_generated_ids"] = bf_ids
        info["bf16_compute_matches_f32"] = [a == s["generated_ids"] for a, s in zip(bf_ids, summary)]
        del mb

        # MLX 4-bit
        if mlx_ok:
            mlx_dir = fdir / "mlx-4bit"
            mlx_convert(hf_dir, mlx_dir)
            info["numpy_quantizer_vs_mlx"] = check_numpy_quant_against_mlx(hf_dir, mlx_dir, mlx_to_hf_source)
            mq = Gemma4ForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
            sd, extra = dequantized_hf_state(mlx_dir, mq)
            missing = mq.load_state_dict(sd, strict=False)
            info["dequant_load"] = dict(missing=list(missing.missing_keys), unexpected=list(missing.unexpected_keys), extra=extra)
            mq.tie_weights()
            # The oracle of the 4-bit path: every step's logits and the prompt logits, as the main reference
            # (the hidden states are left out: nothing compares the 4-bit path layer by layer).
            dt, ds = run_reference(mq, prompts, "dequant4bit-f32", hidden=False)
            np_save_file(dt, str(ref_dir / "dequant4bit_reference.safetensors"))
            write_json(ref_dir / "dequant4bit_reference.json", dict(
                what="transformers float32 compute on the 4-bit weights of mlx-4bit/ dequantized (w = scale*q + bias)",
                prompts=ds))
            for dtn in ("bfloat16", "float32"):
                try:
                    xt, xs = mlx_greedy(mlx_dir, prompts, dtn)
                except RuntimeError as e:
                    # mlx 0.32.4 CPU: an unquantized SwitchLinear (expert down_proj whose input dim is not a multiple
                    # of 64, left in bf16 by mlx_lm) runs GatherMM, which only supports float32 on CPU.
                    info[f"mlx_{dtn}_error"] = repr(e)
                    log(f"   mlx {dtn} run failed (no mlx4bit_{dtn}_reference): {e!r}")
                    continue
                np_save_file(xt, str(ref_dir / f"mlx4bit_{dtn}_reference.safetensors"))
                write_json(ref_dir / f"mlx4bit_{dtn}_reference.json", dict(
                    what=f"mlx_lm model on mlx-4bit/, {dtn} activations, greedy with mlx_lm KV caches",
                    saved_steps=SAVE_STEPS_SHORT, prompts=xs))
                info[f"mlx_{dtn}_matches_dequant_f32"] = [a["generated_ids"] == b["generated_ids"] for a, b in zip(xs, ds)]
            info["dequant_f32_matches_bf16_f32"] = [a["generated_ids"] == b["generated_ids"] for a, b in zip(ds, summary)]
            info["mlx_unquantized_weights"] = mlx_unquantized_weights(mlx_dir)
            del mq
        info["seconds"] = round(time.time() - t0, 2)
        info["bytes"] = file_size(fdir)
        info["files"] = {str(p.relative_to(fdir)): p.stat().st_size for p in sorted(fdir.rglob("*")) if p.is_file()}
        write_json(fdir / "fixture.json", info)
        manifest["fixtures"][name] = dict(bytes=info["bytes"], seconds=info["seconds"])
        log(f"   {name}: {info['bytes']/1e6:.2f} MB in {info['seconds']}s")

    # assistants (MTP drafters), each paired with its target
    for aname, aspec in ASSISTANTS.items():
        if not ((args.only is None or aname in args.only) and aspec["target"] in targets):
            continue
        t0 = time.time()
        log(f"== {aname}")
        fdir = OUT / aname
        if fdir.exists():
            shutil.rmtree(fdir)
        ref_dir = fdir / "ref"
        ref_dir.mkdir(parents=True)
        a, asrc = build_assistant(aname)
        target = targets[aspec["target"]]
        init_info = dict(mode="random")
        if aspec["mode"] == "copy":
            init_info = copy_drafter_init_(target, a, aspec["seed"])
            log(f"   copy drafter: {init_info}")
        save_hf_folder(a, asrc, fdir / "hf", tok_dir, kind="assistant")
        a2 = Gemma4AssistantForCausalLM.from_pretrained(str(fdir / "hf"), dtype=torch.float32).eval()
        a2.generation_config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
        a2.generation_config.num_assistant_tokens_schedule = "constant"
        tensors = {}
        info = dict(target=aspec["target"], real_counterpart=aspec["real"], text_config=asrc, top_level=aspec["top"],
                    init=init_info, num_assistant_tokens=NUM_ASSISTANT_TOKENS,
                    num_params=int(sum(p.numel() for p in a2.parameters()) - a2.lm_head.weight.numel()),
                    prompts=[])
        ref_target = json.load(open(OUT / aspec["target"] / "ref" / "reference.json"))["prompts"]
        for i, p in enumerate(prompts):
            tt, tr = drafter_trace(target, a2, p["ids"])
            for k, v in tt.items():
                tensors[f"p{i}.{k}"] = v
            gen, rounds = assisted_generation_log(target, a2, p["ids"])
            tr.update(assisted_generated_ids=gen, assisted_matches_plain_greedy=(gen == ref_target[i]["generated_ids"]),
                      first_round_matches_trace=(rounds[0]["drafted"] == [s_["drafted_token"] for s_ in tr["steps"]]) if rounds else None,
                      total_accepted=sum(r.get("num_accepted", 0) for r in rounds), rounds=rounds)
            tensors[f"p{i}.prompt_ids"] = np.asarray(p["ids"], dtype=np.int64)
            tensors[f"p{i}.assisted_generated_ids"] = np.asarray(gen, dtype=np.int64)
            info["prompts"].append(tr)
            log(f"   {p['name']}: drafted {[s_['drafted_token'] for s_ in tr['steps']]} after target token {tr['target_first_token']}"
                f" | assisted==greedy {tr['assisted_matches_plain_greedy']} rounds {len(rounds)} accepted {tr['total_accepted']}"
                f" | trace==round0 {tr['first_round_matches_trace']}")
        np_save_file(tensors, str(ref_dir / "drafter_reference.safetensors"))
        # 4-bit (numpy quantizer, MLX layout, HF tensor names) + drafter trace on the dequantized weights
        qdir = fdir / "mlx-4bit"
        qnames = quantize_assistant_numpy(fdir / "hf", qdir)
        aq = Gemma4AssistantForCausalLM.from_pretrained(str(fdir / "hf"), dtype=torch.float32).eval()
        aq.load_state_dict(dequant_assistant_state(qdir, aq), strict=False)
        aq.tie_weights()
        qt = {}
        qsteps = []
        for i, p in enumerate(prompts):
            tt, tr = drafter_trace(target, aq, p["ids"])
            for k, v in tt.items():
                if k.startswith("step"):
                    qt[f"p{i}.{k}"] = v
            qsteps.append([s_["drafted_token"] for s_ in tr["steps"]])
        np_save_file(qt, str(ref_dir / "drafter_dequant4bit_reference.safetensors"))
        info["quantized_tensors_4bit"] = qnames
        info["dequant4bit_drafted_tokens"] = qsteps
        write_json(ref_dir / "drafter_reference.json", dict(
            what=("first drafting round after prefill of each prompt on the float32 target, replicating "
                  "transformers' SinglePositionMultiTokenCandidateGenerator (see drafter_trace), plus the log of a "
                  "full assisted greedy generation (rounds: context_len, drafted tokens, num_accepted)"),
            prompts=info["prompts"], dequant4bit_drafted_tokens=qsteps))
        info["prompts"] = [dict(prompt=p_["name"], total_accepted=x["total_accepted"],
                                assisted_matches_plain_greedy=x["assisted_matches_plain_greedy"])
                           for p_, x in zip(prompts, info["prompts"])]
        info["seconds"] = round(time.time() - t0, 2)
        info["bytes"] = file_size(fdir)
        info["files"] = {str(p.relative_to(fdir)): p.stat().st_size for p in sorted(fdir.rglob("*")) if p.is_file()}
        write_json(fdir / "fixture.json", info)
        manifest["fixtures"][aname] = dict(bytes=info["bytes"], seconds=info["seconds"])
        log(f"   {aname}: {info['bytes']/1e6:.2f} MB in {info['seconds']}s")

    if args.only is not None and (OUT / "manifest.json").exists():
        # keep the entries of the fixtures this run did not rebuild
        old = json.load(open(OUT / "manifest.json")).get("fixtures", {})
        manifest["fixtures"] = {**{k: v for k, v in old.items() if k not in manifest["fixtures"]}, **manifest["fixtures"]}
    manifest["special_tokens"] = dict(text=GEMMA4_SPECIAL_TOKENS, newline=GEMMA4_NEWLINE_ID,
                                      multimodal=GEMMA4_MULTIMODAL_IDS, eos_token_ids=GEMMA4_EOS_IDS)
    manifest["total_bytes"] = file_size(OUT)
    manifest["seconds"] = round(time.time() - t_all, 2)
    write_json(OUT / "manifest.json", manifest)
    log(f"done: {manifest['total_bytes']/1e6:.2f} MB in {manifest['seconds']}s")


if __name__ == "__main__":
    main()
