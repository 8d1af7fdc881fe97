#!/usr/bin/env python3
"""Peer benchmark for Kestrel: Hugging Face transformers on the same synthetic Gemma 4.

What it measures
    Prefill (pp) and greedy batch-1 decode (tg) throughput of transformers' own Gemma 4 text model
    (Gemma4ForCausalLM) in bf16, built from the config.json that `kestrel synth --arch ...` writes,
    so that `kestrel bench` and this peer can be run on the same architecture in the same run
    on the same GPU (tools/device/table.sh, peer.sh). Two modes:
      eager    plain PyTorch eager, the model's default dynamic KV cache (DynamicCache).
      compile  a StaticCache plus torch.compile(model.forward, mode="reduce-overhead",
               fullgraph=True) for the decode step (CUDA graphs on CUDA), which is what transformers
               recommends for fast static-shape decoding. Prefill runs uncompiled into the static
               cache, as `generate()` does. If fullgraph compilation fails, the error is recorded
               and it is retried once with fullgraph=False (recorded as such); if that fails too,
               the mode reports {"error": ...} and the script carries on.

How
    * The model is built from the config alone (no weights are loaded: the 4-bit MLX weights that
      synth writes are ignored and `quantization_config` is dropped), with transformers' random
      init, directly on the target device (a `torch.device` context) so that a 26B-A4B model is
      not first materialised on the CPU. Random weights are fine: only the timing matters.
      Accepts a bare `gemma4_text` config (what synth writes) or the multimodal wrapper form
      (`text_config` is used). Build + init time is reported as init_s (not part of any rate).
    * Prompt: p random token ids (fixed seed), batch 1.
    * pp: one forward over the p prompt tokens into a fresh cache (logits for the last position
      only, as generate() does), after --warmup untimed runs; torch.cuda.synchronize() around it.
      Never compiled (pp_compiled: false), also in the compile mode. Note that with last-position
      logits transformers runs E2B/E4B's KV-shared layers for the last prompt position only.
    * tg: default --method loop: a hand-written greedy loop, identical for both modes: prefill
      (untimed), then n steps of forward(one token, position, cache) -> argmax -> next token,
      timed from a synchronize before the first step to a synchronize after the last. No host sync
      inside the loop (like generate()'s deferred stop check); --sync-each-step adds one (closer to
      a streaming server and to kestrel, which reads back each token). No EOS can stop it: the loop
      has no stopping criterion, so exactly n tokens are produced.
      --method generate instead times model.generate(do_sample=False, eos_token_id=None,
      min_new_tokens=max_new_tokens) for n+1 and for 1 new tokens and reports the difference
      (= n decode steps incl. generate()'s per-step overhead, prefill and setup cancelled).
      During decode, MoE experts switch from grouped_mm to batched_mm on GPU, as generate() does.
    * tg is reported twice (--tg-ctx both, the default):
        tg_tok_s       n tokens after the p-token prompt;
        tg_ctx1_tok_s  n tokens after a one-token context, which is how `kestrel bench` (and
                       llama-bench) define tg: compare kestrel's tg with this one.
    * compile: the first --warmup runs of every measured shape (compilation, CUDA-graph recording)
      are not timed; their wall time is reported as warmup_s. Dynamo's graph counters are recorded
      and `recompiled_while_timing` flags a recompilation inside the timed runs.

Why
    Kestrel's decode tok/s needs a reference point from a widely used runtime on the same GPU and
    the same architecture. transformers is the reference implementation of Gemma 4 (it is also the
    correctness oracle, see tools/oracle/), so its bf16 eager and static-cache + torch.compile
    numbers are the natural peers. They are not a like-for-like comparison with Kestrel's 4-bit
    weights: bf16 reads about 4x the weight bytes per token; report it that way.

Usage
    python3 tools/peer/hf_bench.py --config /tmp/e2b/config.json -p 512 -n 128 --json out.json
    python3 tools/peer/hf_bench.py --config tests/fixtures/tiny-e2b/hf/config.json \
        -p 16 -n 8 --device cpu
"""

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time
import traceback


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config.json written by `kestrel synth` (bare gemma4_text or wrapper form)")
    ap.add_argument("-p", type=int, default=512, help="prompt length (pp, and the context of tg) [512]")
    ap.add_argument("-n", type=int, default=128, help="decode tokens [128]")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile [eager,compile]")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (for local testing)")
    ap.add_argument("--json", dest="json_path", default=None, help="write the results as JSON here")
    ap.add_argument("--reps", type=int, default=1, help="timed repetitions; the median is reported [1]")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each measured shape first [1]")
    ap.add_argument("--method", choices=["loop", "generate"], default="loop", help="decode timing method [loop]")
    ap.add_argument("--tg-ctx", choices=["both", "prompt", "1"], default="both",
                    help="decode after the p-token prompt, after a 1-token context (kestrel bench's tg), or both [both]")
    ap.add_argument("--sync-each-step", action="store_true", help="loop method: read each token back to the host")
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers' default, sdpa)")
    ap.add_argument("--no-fallback", action="store_true", help="compile: do not retry with fullgraph=False")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load_text_config_dict(path):
    """The text config as a dict: `text_config` of the wrapper form, else the file itself."""
    with open(path) as f:
        d = json.load(f)
    if isinstance(d.get("text_config"), dict):
        outer = d
        d = dict(d["text_config"])
        # Token ids live on the wrapper in the multimodal form.
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if d.get(k) is None and outer.get(k) is not None:
                d[k] = outer[k]
    else:
        d = dict(d)
    # synth writes MLX quantisation metadata; the peer runs bf16 from random init.
    for k in ("quantization_config", "quantization"):
        d.pop(k, None)
    # Fields that only make sense for a loaded checkpoint / the wrapper.
    for k in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        d.pop(k, None)
    d.setdefault("model_type", "gemma4_text")
    return d


def main(argv=None):
    args = parse_args(argv)
    import torch
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001
        sys.exit(f"error: cannot import transformers: {e}")
    print(f"torch {torch.__version__}  transformers {transformers.__version__}", flush=True)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("eager", "compile"):
            sys.exit(f"error: unknown mode {m!r} (eager, compile)")
    if args.p < 1 or args.n < 1:
        sys.exit("error: -p and -n must be >= 1")

    dev = torch.device(args.device)
    on_cuda = dev.type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch.cuda.is_available() is False (use --device cpu to test locally)")
    device_name = torch.cuda.get_device_name(dev) if on_cuda else "cpu"

    # --- config -----------------------------------------------------------------------------
    cfg_dict = load_text_config_dict(args.config)
    model_type = cfg_dict.pop("model_type")
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        supported = model_type in CONFIG_MAPPING
    except Exception:  # noqa: BLE001
        supported = False
    if not supported:
        sys.exit(
            f"error: transformers {transformers.__version__} has no Gemma 4 support "
            f"(model_type {model_type!r} is unknown); install a transformers release with Gemma 4 "
            f"(the oracle fixtures were made with 5.24.0)"
        )
    config = AutoConfig.for_model(model_type, **cfg_dict)
    # Keys this transformers' config class does not know are kept as plain attributes but ignored
    # by the model: warn, as that would silently build a different architecture than kestrel's.
    # (Keys the class consumes in __init__, e.g. global_head_dim -> per_layer_config in 5.24, are
    # neither defaults nor left as attributes.)
    try:
        known = set(type(config)().to_dict().keys())
        unknown = sorted(k for k in cfg_dict if k not in known and hasattr(config, k))
    except Exception:  # noqa: BLE001
        unknown = []
    if unknown:
        log(f"warning: config keys unknown to {type(config).__name__} in transformers {transformers.__version__} "
            f"(the model ignores them; the architecture may differ from kestrel's): {unknown}")
    config.use_cache = True

    # --- model, built on the device from random init ------------------------------------------
    kw = {}
    if args.attn:
        kw["attn_implementation"] = args.attn
    torch.manual_seed(args.seed)  # the same random weights on every run
    t0 = time.perf_counter()
    with torch.device(dev):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, **kw)
        except TypeError:  # older transformers: torch_dtype
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16, **kw)
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    if on_cuda:
        torch.cuda.synchronize(dev)
    init_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    stray = sorted({str(p.device) for p in model.parameters() if p.device.type != dev.type})
    if stray:
        log(f"warning: parameters on {stray} after init")
    attn_impl = getattr(model.config, "_attn_implementation", None)
    experts_impl = getattr(model.config, "_experts_implementation", None) if getattr(model.config, "enable_moe_block", False) else None
    desc = f"attn={attn_impl}" + (f", experts={experts_impl}" if experts_impl else "")
    print(f"model {type(model).__name__}: {params / 1e9:.3f} B params, bf16, built on {device_name} "
          f"in {init_s:.1f} s (random init), {desc}", flush=True)

    # --- inputs -------------------------------------------------------------------------------
    vocab = config.vocab_size
    if getattr(config, "hidden_size_per_layer_input", 0):
        vocab = min(vocab, getattr(config, "vocab_size_per_layer_input", vocab) or vocab)
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(3, vocab, (1, args.p), generator=g).to(dev)  # 0..2: pad, eos, bos
    max_len = args.p + args.n + 8
    positions = torch.arange(max_len, device=dev).unsqueeze(0)

    fwd_params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in fwd_params else "past_key_values"
    keep_kw = "logits_to_keep" if "logits_to_keep" in fwd_params else ("num_logits_to_keep" if "num_logits_to_keep" in fwd_params else None)
    wants_cache_position = "cache_position" in fwd_params

    def sync():
        if on_cuda:
            torch.cuda.synchronize(dev)

    def step_kwargs(ids, start, cache):
        kw = {"input_ids": ids, "position_ids": positions[:, start:start + ids.shape[1]], cache_kw: cache, "use_cache": True}
        if keep_kw:
            kw[keep_kw] = 1
        if wants_cache_position:
            kw["cache_position"] = positions[0, start:start + ids.shape[1]]
        return kw

    def out_cache(out):
        c = getattr(out, "cache", None)
        if c is None:
            c = getattr(out, "past_key_values", None)
        return c

    decode_ctx = getattr(model, "_optimize_model_for_decode", None)

    def decode_context():
        # generate() switches MoE experts grouped_mm -> batched_mm for decoding on GPU; do the same.
        return decode_ctx() if decode_ctx is not None else contextlib.nullcontext()

    def new_static_cache():
        from transformers import StaticCache
        try:
            return StaticCache(config=model.config, max_cache_len=max_len)
        except TypeError:  # older signature
            return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device=dev, dtype=torch.bfloat16)

    def dynamo_counter(group, name):
        try:
            import torch._dynamo.utils as du
            return int(du.counters[group][name])
        except Exception:  # noqa: BLE001
            return None

    def dynamo_graphs():
        return dynamo_counter("stats", "unique_graphs")

    if args.method == "generate":
        model.generation_config.eos_token_id = None  # nothing may stop generate() early

    # --- one mode ------------------------------------------------------------------------------
    def run_mode(mode, fullgraph=True):
        static = mode == "compile"
        res = {"cache": "static" if static else "dynamic", "method": args.method, "pp_compiled": False}
        cache = new_static_cache() if static else None
        step_fn = model.forward
        mark_step = None
        if static:
            torch._dynamo.reset()
            step_fn = torch.compile(model.forward, mode="reduce-overhead", fullgraph=fullgraph)
            res["compile"] = {"mode": "reduce-overhead", "fullgraph": fullgraph}
            if on_cuda and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                mark_step = torch.compiler.cudagraph_mark_step_begin

        def prefill(ids):
            """Fresh cache, prompt through the uncompiled forward. Returns (first token, cache)."""
            nonlocal cache
            if static:
                cache.reset()
                c = cache
            else:
                c = None
            out = model(**step_kwargs(ids, 0, c))
            return out.logits[:, -1, :].argmax(-1, keepdim=True), (c if static else out_cache(out))

        def decode(tok, start, c, n):
            toks = [tok]
            for i in range(n):
                if mark_step is not None:
                    mark_step()
                out = step_fn(**step_kwargs(tok, start + i, c))
                tok = out.logits[:, -1, :].argmax(-1, keepdim=True)
                toks.append(tok)
                if args.sync_each_step:
                    tok.item()
            return toks

        last_tokens = {}

        def time_loop(ctx_len):
            ids = prompt[:, :ctx_len]
            tok, c = prefill(ids)
            with decode_context():
                sync()
                t = time.perf_counter()
                toks = decode(tok, ctx_len, c, args.n)
                sync()
                dt = time.perf_counter() - t
            # The greedy continuation (first token from the prefill), for eyeballing eager vs compile.
            last_tokens[ctx_len] = torch.cat(toks, 1)[0, :16].tolist()
            return dt

        def time_generate(ctx_len, new_tokens):
            from transformers import GenerationConfig
            gc = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  eos_token_id=None, pad_token_id=config.pad_token_id or 0, use_cache=True,
                                  disable_compile=not static)
            gkw = {}
            if static:
                cache.reset()
                gkw[cache_kw] = cache
                try:
                    from transformers import CompileConfig
                    cc = CompileConfig(fullgraph=fullgraph, mode="reduce-overhead")
                    if not on_cuda:
                        cc._compile_all_devices = True  # compile on CPU too (local testing)
                    gc.compile_config = cc
                except ImportError:
                    pass
            sync()
            t = time.perf_counter()
            out = model.generate(prompt[:, :ctx_len], generation_config=gc, **gkw)
            sync()
            dt = time.perf_counter() - t
            produced = out.shape[1] - ctx_len
            if produced != new_tokens:
                raise RuntimeError(f"generate produced {produced} tokens, wanted {new_tokens}")
            if new_tokens > 1:
                last_tokens[ctx_len] = out[0, ctx_len:ctx_len + 16].tolist()
            return dt

        with torch.no_grad():
            # pp: one forward over the prompt (uncompiled; into a static cache in compile mode).
            t = time.perf_counter()
            for _ in range(max(args.warmup, 1)):
                prefill(prompt)
            sync()
            res["pp_warmup_s"] = time.perf_counter() - t
            pp_times = []
            for _ in range(args.reps):
                sync()
                t = time.perf_counter()
                prefill(prompt)
                sync()
                pp_times.append(time.perf_counter() - t)
            res["pp_tok_s"] = args.p / statistics.median(pp_times)
            res["pp_ms"] = statistics.median(pp_times) * 1e3

            ctxs = {"both": [args.p, 1] if args.p > 1 else [1], "prompt": [args.p], "1": [1]}[args.tg_ctx]
            # Warm-up (compilation, CUDA graph recording) of every shape that is timed.
            t = time.perf_counter()
            for _ in range(max(args.warmup, 1 if static else 0)):
                for ctx in ctxs:
                    if args.method == "loop":
                        time_loop(ctx)
                    else:
                        time_generate(ctx, args.n + 1)
                        time_generate(ctx, 1)
            res["warmup_s"] = time.perf_counter() - t
            graphs_before = dynamo_graphs() if static else None

            for ci, ctx in enumerate(ctxs):
                if args.method == "loop":
                    times = [time_loop(ctx) for _ in range(args.reps)]
                    secs = statistics.median(times)
                else:
                    long = [time_generate(ctx, args.n + 1) for _ in range(args.reps)]
                    short = [time_generate(ctx, 1) for _ in range(args.reps)]
                    times = [a - b for a, b in zip(long, short)]
                    secs = statistics.median(long) - statistics.median(short)
                # ctxs is [p, 1] for "both": the first is the prompt context even when p == 1.
                key = "tg_ctx1" if args.tg_ctx == "1" or ci == 1 else "tg"
                res[f"{key}_tok_s"] = args.n / secs if secs > 0 else None
                res["ms_per_token" if key == "tg" else f"{key}_ms_per_token"] = secs / args.n * 1e3
                res[f"{key}_reps_s"] = times
                res[f"{key}_tokens_head"] = last_tokens.get(ctx)
            if args.tg_ctx == "both" and args.p == 1:  # one measurement serves both
                res.update({"tg_ctx1_tok_s": res["tg_tok_s"], "tg_ctx1_ms_per_token": res["ms_per_token"]})
            res["pp_reps_s"] = pp_times
            if static:
                graphs_after = dynamo_graphs()
                res["compile"]["dynamo_unique_graphs"] = graphs_after
                # >0 on CUDA means inductor fell back from CUDA graphs for some graph (see its log).
                res["compile"]["cudagraph_skips"] = dynamo_counter("inductor", "cudagraph_skips")
                res["recompiled_while_timing"] = (graphs_before is not None and graphs_after is not None
                                                  and graphs_after > graphs_before)
        if on_cuda:
            res["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9
        return res

    results = {}

    def write_report():
        """Rewritten after each mode, so a run killed in the compile mode keeps the eager numbers."""
        if not args.json_path:
            return
        report = {
            "peer": "transformers",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device_name,
            "config": args.config,
            "params": params,
            "dtype": "bfloat16",
            "attn_implementation": attn_impl,
            "experts_implementation": experts_impl,
            "init_s": init_s,
            "p": args.p,
            "n": args.n,
            # tg_*: decode after the p-token prompt; tg_ctx1_*: after a 1-token context (kestrel bench's tg).
            "tg_context": {"tg": args.p, "tg_ctx1": 1},
            "method": args.method,
            "reps": args.reps,
            "warmup": args.warmup,
            "sync_each_step": args.sync_each_step,
            "unknown_config_keys": unknown,
            "complete": len(results) == len(modes),
            "modes": results,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        tmp = args.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json_path)

    write_report()
    for mode in modes:
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        log(f"{mode}: running" + (" (compilation takes minutes)" if mode == "compile" else ""))
        try:
            results[mode] = run_mode(mode)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
            log(f"{mode} failed:\n{traceback.format_exc()}")
            if mode == "compile" and not args.no_fallback:
                log("retrying compile with fullgraph=False")
                try:
                    r = run_mode(mode, fullgraph=False)
                    r["fullgraph_error"] = err[:4000]
                    results[mode] = r
                except Exception as e2:  # noqa: BLE001
                    log(f"{mode} (fullgraph=False) failed:\n{traceback.format_exc()}")
                    results[mode] = {"error": err[:4000], "error_no_fullgraph": f"{type(e2).__name__}: {e2}"[:4000]}
            else:
                results[mode] = {"error": err[:4000]}
        finally:
            try:
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass
            if on_cuda:
                torch.cuda.empty_cache()
        write_report()
        r = results[mode]
        if "error" in r:
            print(f"| transformers {mode:7s} | error: {r['error'].splitlines()[0][:200]} |", flush=True)
            continue
        cells = [f"transformers {mode:7s}", f"pp{args.p} {r['pp_tok_s']:9.1f} tok/s"]
        if "tg_tok_s" in r:
            cells.append(f"tg{args.n}@{args.p} {r['tg_tok_s']:7.1f} tok/s ({r['ms_per_token']:.2f} ms/tok)")
        if "tg_ctx1_tok_s" in r:
            cells.append(f"tg{args.n}@1 {r['tg_ctx1_tok_s']:7.1f} tok/s ({r['tg_ctx1_ms_per_token']:.2f} ms/tok)")
        extra = f"warmup {r['warmup_s']:.1f} s"
        if mode == "compile":
            extra += f", fullgraph={r['compile']['fullgraph']}"
            if r.get("recompiled_while_timing"):
                extra += ", RECOMPILED WHILE TIMING"
        cells.append(extra)
        print("| " + " | ".join(cells) + " |", flush=True)

    if args.json_path:
        print(f"wrote {args.json_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
