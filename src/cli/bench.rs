//! `kestrel bench`: prefill (pp) and decode (tg) throughput in the style of llama-bench, with
//! the bytes a decode step reads, the bandwidth that implies, the device's own copy bandwidth
//! as the roofline, and per-kernel GPU time from timestamp queries.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;

use super::generate::load_model;
use super::BenchArgs;
use crate::backend::wgpu::{DraftModel, WgpuBackend, WgpuOptions};
use crate::backend::{Backend, BackendKind, Readback};

/// Deterministic prompt ids (no tokenizer needed): spread over the vocabulary, never special.
fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| (1000 + i * 7919) as u32 % vocab.max(2) as u32).collect()
}

/// Prefill warm-up before the timed passes: at least this many passes of the prompt and this
/// much wall time (the GPU's clocks ramp over tens to hundreds of milliseconds of load), at
/// most `WARMUP_MAX_PASSES` passes.
const WARMUP_MIN_PASSES: usize = 3;
const WARMUP_MIN_TIME: std::time::Duration = std::time::Duration::from_millis(500);
const WARMUP_MAX_PASSES: usize = 50;

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    if !args.compare.is_empty() {
        return compare(&args);
    }
    if args.model.backend != BackendKind::Wgpu {
        return plain(&args);
    }
    let model = load_model(&args.model)?;
    let max_pos = model.cfg.text.max_position_embeddings;
    let depth = args.depth as usize;
    let ctx = args.model.ctx_for(max_pos).max(args.n_prompt.max(depth) + args.n_gen + 1).min(max_pos);
    if depth + args.n_gen + 1 > ctx {
        bail!(
            "--depth {depth} and -n {} need {} positions; the model has {max_pos}",
            args.n_gen,
            depth + args.n_gen + 1
        );
    }
    let expert_slots = super::generate::expert_slots(&args.model, &model)?;
    let drafter = match &args.draft {
        Some(dir) => {
            if args.draft_k == 0 || args.draft_k >= crate::backend::wgpu::VERIFY_MAX {
                bail!("--draft-k {} is out of range: use 1..={}", args.draft_k, crate::backend::wgpu::VERIFY_MAX - 1);
            }
            if args.n_gen == 0 {
                bail!("--draft measures rounds against decode steps: give -n a number of tokens");
            }
            let dm = crate::model::Model::open(dir).with_context(|| format!("loading drafter {}", dir.display()))?;
            let d = crate::spec::Drafter::from_model(&dm)?;
            d.check_target(&model.cfg)?;
            Some(d)
        }
        None => None,
    };
    let opts = WgpuOptions {
        max_ctx: ctx,
        max_chunk: args.model.chunk,
        max_binding: None,
        expert_slots,
        tuning: args.model.tuning()?,
        skip: args.skip.clone(),
        drafter: drafter.as_ref().map(|d| DraftModel(d.config().clone(), d.weights().clone())),
        ..WgpuOptions::default()
    };
    if !opts.skip.is_empty() {
        eprintln!(
            "warning: --skip {} leaves those kernels out of every step: timings only, the output is wrong",
            opts.skip.join(",")
        );
    }
    let mut b =
        WgpuBackend::new(model.cfg.clone(), model.weights.clone(), opts).context("starting the wgpu backend")?;
    if args.list_program {
        print!("{}", b.program_listing());
        return Ok(ExitCode::SUCCESS);
    }
    let vocab = model.cfg.text.vocab_size;

    // Warm-up: compile pipelines, touch every buffer once, and run the whole prompt until the
    // GPU has been busy for a while, so that the timed passes do not pay for its clock ramp (a
    // first pass on a fresh machine ran 20–30 % below the next ones, ledger: 2026-11-30
    // bench-warm-pass; with one warm-up pass, the first process on a freshly started machine
    // sometimes timed all its passes at 1.4–2.7× the GPU time of a chunk, ledger: 2026-12-01
    // bench-warm-up).
    b.prefill(&ids(2, vocab), 0, Readback::Argmax)?;
    if args.n_prompt > 0 {
        let prompt = ids(args.n_prompt, vocab);
        let t0 = Instant::now();
        for pass in 0..WARMUP_MAX_PASSES {
            b.reset();
            b.prefill_prompt(&prompt, args.model.chunk, Readback::Argmax)?;
            if pass + 1 >= WARMUP_MIN_PASSES && t0.elapsed() >= WARMUP_MIN_TIME {
                break;
            }
        }
    }

    // pp: the prompt in chunks, as `generate` runs it.
    let mut pp = None;
    let mut pp_profile = Vec::new();
    if args.n_prompt > 0 {
        let prompt = ids(args.n_prompt, vocab);
        pp = Some(time_prefill(&mut b, &prompt, &args)?);
        // One profiled chunk (the first), when the whole step runs in one pass.
        if b.gpu().can_profile() && b.stream_stats().is_none() {
            b.reset();
            b.set_profiling(true)?;
            b.prefill(&prompt[..prompt.len().min(args.model.chunk)], 0, Readback::Argmax)?;
            pp_profile = b.last_profile().to_vec();
            b.set_profiling(false)?;
        }
    }

    // tg: greedy decode of n tokens after a context of --depth tokens (1: llama-bench's tg).
    // As `generate` runs it: the backend runs one step ahead of the host (decode_greedy).
    let mut tg = None;
    let mut profile = Vec::new();
    let mut streamed = None;
    let mut step_gpu_us = None;
    let mut host_us = None;
    if args.n_gen > 0 {
        b.reset();
        let mut tok = b.prefill_prompt(&ids(depth, vocab), args.model.chunk, Readback::Argmax)?.argmax[0];
        let streamed_before = b.stream_stats();
        let (enc0, steps0) = b.host_encode();
        let t0 = Instant::now();
        b.decode_greedy(tok, depth, args.n_gen, &mut |id| {
            tok = id;
            Ok(true)
        })?;
        let secs = t0.elapsed().as_secs_f64();
        let (enc1, steps1) = b.host_encode();
        let steps = steps1 - steps0;
        if steps > 0 {
            host_us = Some((enc1 - enc0).as_secs_f64() * 1e6 / steps as f64);
        }
        tg = Some((args.n_gen as f64 / secs, secs / args.n_gen as f64));
        streamed = match (b.stream_stats(), streamed_before) {
            (Some(now), Some(before)) => Some(now.since(&before)),
            _ => None,
        };
        // Per-kernel timestamps need the whole step in one pass: not while experts stream.
        if b.gpu().can_profile() && streamed.is_none() {
            b.set_profiling(true)?;
            b.decode(tok, depth + args.n_gen, Readback::Argmax)?;
            profile = b.last_profile().to_vec();
            // The step's own GPU time, without a timestamp after every dispatch: the median
            // of 9 steps timed at the pass's two ends.
            b.set_step_timing(true)?;
            let mut us = Vec::new();
            for _ in 0..9 {
                b.decode(tok, depth + args.n_gen, Readback::Argmax)?;
                us.push(b.last_profile()[0].micros);
            }
            us.sort_by(f64::total_cmp);
            step_gpu_us = Some(us[us.len() / 2]);
            b.set_profiling(false)?;
        }
    }

    // Verify cost: one pass over M = 1..5 tokens (the last accepted token + M − 1 drafts) at
    // the position decode reached, relative to one decode step. Staged, never committed.
    let mut verify_ms: Vec<(usize, f64)> = Vec::new();
    let mut verify_profile = Vec::new();
    if tg.is_some() {
        let pos = b.draft_context().map_or(depth + args.n_gen, |c| c.cached_len());
        let toks = ids(5, vocab);
        for m in 1..=5usize.min(args.model.chunk) {
            b.verify(&toks[..m], pos, false)?;
            let reps = 10;
            let t0 = Instant::now();
            for _ in 0..reps {
                b.verify(&toks[..m], pos, false)?;
            }
            verify_ms.push((m, t0.elapsed().as_secs_f64() * 1e3 / reps as f64));
        }
        // Per-kernel GPU time of a 2-token verify beside the decode step's: where a verify
        // costs more than a decode step.
        if b.gpu().can_profile() && b.stream_stats().is_none() && args.model.chunk >= 2 {
            b.set_profiling(true)?;
            b.verify(&toks[..2], pos, false)?;
            verify_profile = b.last_profile().to_vec();
            b.set_profiling(false)?;
        }
    }

    // Speculative rounds per k against the decode step, and greedy vs speculative decode of
    // the same n tokens after the same prompt, same run.
    let mut rounds: Vec<DraftRound> = Vec::new();
    if let (Some(drafter), Some((_, step_s))) = (&drafter, tg) {
        for k in 1..=args.draft_k {
            rounds.push(time_round(&mut b, drafter, k, step_s * 1e3, &args)?);
        }
    }

    // The roofline: the `copy` kernel timed by timestamps where the adapter has them (what a
    // streaming kernel reaches through this API: ≈ 4.0 TB/s on the H200), else host-timed
    // buffer copies (these read ≈ 0.84 TB/s on the H200: submit and wait dominate).
    let copy_gbs = if b.gpu().can_profile() {
        crate::backend::wgpu::harness::KernelHarness::with_gpu(b.gpu().clone(), &b.options().tuning).copy_roofline()?
    } else {
        b.gpu().copy_bandwidth(1 << 30, 10)?
    };
    let bytes = b.decode_bytes() as f64;
    let gbs = tg.map(|(_, s)| bytes / s / 1e9);
    let gpu_us: f64 = profile.iter().map(|k| k.micros).sum();

    if args.json {
        let obj = json!({
            "model": model.source,
            "device": b.device_info(),
            "backend": "wgpu",
            "tuning": b.options().tuning.to_json(),
            "skip": &b.options().skip,
            "pp": pp.map(|(t, lo, hi)| json!({"tokens": args.n_prompt, "tok_s": t, "repetitions": args.reps, "tok_s_min": lo, "tok_s_max": hi, "tail_from_layer": b.prompt_tail_layer()})),
            "tg": tg.map(|(t, s)| json!({
                "tokens": args.n_gen, "tok_s": t, "ms_per_token": s * 1e3,
                "bytes_per_token": bytes, "gb_s": bytes / s / 1e9,
                "roofline_gb_s": copy_gbs, "roofline_fraction": bytes / s / 1e9 / copy_gbs,
                "gpu_us_per_token": if profile.is_empty() { None } else { Some(gpu_us) },
                "step_gpu_us": step_gpu_us,
                "host_encode_us": host_us,
                "dispatches": b.decode_dispatches(depth + args.n_gen),
                "depth": depth,
            })),
            "experts": streamed.map(|e| e.to_json()),
            "verify": verify_ms.iter().map(|&(m, ms)| json!({"m": m, "ms": ms, "vs_decode": tg.map(|(_, s)| ms / (s * 1e3))})).collect::<Vec<_>>(),
            "draft": rounds.iter().map(DraftRound::to_json).collect::<Vec<_>>(),
            "device_weight_bytes": b.memory().weight_bytes,
            "device_state_bytes": b.memory().state_bytes,
            "peak_rss_bytes": super::generate::peak_rss_bytes(),
            "prefill_kernels": pp_profile.iter().map(|k| json!({"kernel": k.kernel, "dispatches": k.dispatches, "us": k.micros})).collect::<Vec<_>>(),
            "kernels": profile.iter().map(|k| json!({"kernel": k.kernel, "dispatches": k.dispatches, "us": k.micros})).collect::<Vec<_>>(),
            "verify2_kernels": verify_profile.iter().map(|k| json!({"kernel": k.kernel, "dispatches": k.dispatches, "us": k.micros})).collect::<Vec<_>>(),
        });
        println!("{obj}");
    } else {
        println!("model: {}   device: {}", model.source, b.device_info());
        let changes = b.options().tuning.changes();
        let changed =
            if changes.is_empty() { "defaults".to_string() } else { format!("changed: {}", changes.join(",")) };
        println!("tuning: {} ({changed})", b.options().tuning);
        println!("| test | tok/s | ms/token | GB/token | GB/s | roofline (copy) GB/s | % of roofline |");
        println!("|---|---|---|---|---|---|---|");
        if let Some((t, _, _)) = pp {
            println!("| pp{} | {t:.1} | {:.3} | | | | |", args.n_prompt, 1e3 / t);
        }
        if let (Some((t, s)), Some(g)) = (tg, gbs) {
            println!(
                "| tg{} | {t:.1} | {:.3} | {:.3} | {g:.1} | {copy_gbs:.1} | {:.1} % |",
                args.n_gen,
                s * 1e3,
                bytes / 1e9,
                100.0 * g / copy_gbs
            );
        }
        // What pp measured: the layers past the last K/V write run for a prompt's last token alone.
        if let (Some(_), Some(l)) = (pp, b.prompt_tail_layer()) {
            println!("pp: layers 0–{} and layer {l}'s q/k/v for every prompt token, the rest for its last token alone (nothing there writes the cache; --tuning prompt_tail=off: every layer for every token)", l.saturating_sub(1));
        }
        if let (false, Some((_, s))) = (verify_ms.is_empty(), tg) {
            println!("\nverify pass (M tokens) vs one decode step ({:.3} ms):", s * 1e3);
            println!("| M | ms | × decode |");
            println!("|---|---|---|");
            for &(m, ms) in &verify_ms {
                println!("| {m} | {ms:.3} | {:.2} |", ms / (s * 1e3));
            }
        }
        if let (false, Some((_, s))) = (rounds.is_empty(), tg) {
            print_rounds(&rounds, s * 1e3);
        }
        if let Some(e) = &streamed {
            println!(
                "\nexperts (decode): hit rate {:.1} % | {:.1} MiB read/token | I/O {:.2} ms/token | {} evictions",
                100.0 * e.hit_rate(),
                e.bytes_per_token() / 1048576.0,
                e.io_ms_per_token(),
                e.evictions
            );
        }
        let mem = b.memory();
        println!(
            "memory: device {:.0} MiB weights + {:.0} MiB state | peak RSS {:.0} MiB",
            mem.weight_bytes as f64 / 1048576.0,
            mem.state_bytes as f64 / 1048576.0,
            super::generate::peak_rss_bytes().unwrap_or(0) as f64 / 1048576.0
        );
        if !pp_profile.is_empty() {
            let us: f64 = pp_profile.iter().map(|k| k.micros).sum();
            println!("\nGPU time of one {}-token prefill chunk: {us:.1} µs", args.n_prompt.min(args.model.chunk));
            println!("| kernel | dispatches | µs | % |");
            println!("|---|---|---|---|");
            for k in &pp_profile {
                println!("| {} | {} | {:.1} | {:.1} |", k.kernel, k.dispatches, k.micros, 100.0 * k.micros / us);
            }
        }
        if let Some((_, s)) = tg {
            let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0} µs"));
            println!(
                "\ndecode step: wall {:.0} µs | GPU {} (pass timestamps, median of 9) | host recording + submit {} | {} dispatches",
                s * 1e6,
                opt(step_gpu_us),
                opt(host_us),
                b.decode_dispatches(depth + args.n_gen)
            );
        }
        if !profile.is_empty() {
            println!("\nGPU time of one decode step with a timestamp after every dispatch: {gpu_us:.1} µs over {} dispatches", profile.iter().map(|k| k.dispatches).sum::<usize>());
            println!("| kernel | dispatches | µs | % |");
            println!("|---|---|---|---|");
            for k in &profile {
                println!("| {} | {} | {:.1} | {:.1} |", k.kernel, k.dispatches, k.micros, 100.0 * k.micros / gpu_us);
            }
        }
        if !verify_profile.is_empty() {
            let us: f64 = verify_profile.iter().map(|k| k.micros).sum();
            println!(
                "\nGPU time of one 2-token verify, timed the same way: {us:.1} µs over {} dispatches",
                verify_profile.iter().map(|k| k.dispatches).sum::<usize>()
            );
            println!("| kernel | dispatches | µs | % |");
            println!("|---|---|---|---|");
            for k in &verify_profile {
                println!("| {} | {} | {:.1} | {:.1} |", k.kernel, k.dispatches, k.micros, 100.0 * k.micros / us);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Acceptance rates the cost model of `bench --draft` evaluates.
const ACCEPTANCE: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];

/// One k of `bench --draft`: what a round costs against a decode step, and the speedup measured.
struct DraftRound {
    k: usize,
    /// The drafter's k steps alone (one submission, the host waiting for the drafts).
    draft_ms: f64,
    /// The verify of k + 1 tokens alone.
    verify_ms: f64,
    /// A whole round with the host in between: draft + verify (`draft_verify`), read, commit.
    round_ms: f64,
    /// A round of the measured speculative run, where rounds run ahead of the host
    /// (`Backend::speculate`): its decode time over its target passes.
    ahead_round_ms: f64,
    decode_ms: f64,
    greedy_tok_s: f64,
    spec_tok_s: f64,
    stats: crate::engine::speculative::SpecStats,
}

impl DraftRound {
    /// The cost of a round in decode steps, as generation pays it: the rounds run ahead of the
    /// host (`ahead_round_ms`).
    fn round_steps(&self) -> f64 {
        self.ahead_round_ms / self.decode_ms
    }

    /// Speedup over greedy when each draft is accepted with probability `a` (independently, a
    /// round stopping at its first rejection): the expected tokens of a round, 1 + a + … + a^k
    /// (accepted drafts and the target's own token), over its cost in decode steps.
    fn expected_speedup(&self, a: f64) -> f64 {
        let tokens: f64 = (0..=self.k).map(|j| a.powi(j as i32)).sum();
        tokens / self.round_steps()
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "k": self.k,
            "draft_ms": self.draft_ms,
            "verify_ms": self.verify_ms,
            "round_ms": self.round_ms,
            "decode_ms": self.decode_ms,
            "round_vs_decode": self.round_steps(),
            "ahead_round_ms": self.ahead_round_ms,
            "expected_speedup": ACCEPTANCE.iter().map(|&a| json!({"acceptance": a, "speedup": self.expected_speedup(a)})).collect::<Vec<_>>(),
            "measured": {
                "greedy_tok_s": self.greedy_tok_s,
                "speculative_tok_s": self.spec_tok_s,
                "speedup": self.spec_tok_s / self.greedy_tok_s,
                "stats": self.stats.to_json(),
            },
        })
    }
}

/// Times the parts of a round of k drafts at the position a prompt of -p tokens (at least one)
/// leaves, then greedy against speculative decode of -n tokens after it.
fn time_round(
    b: &mut WgpuBackend,
    drafter: &crate::spec::Drafter,
    k: usize,
    decode_ms: f64,
    args: &BenchArgs,
) -> anyhow::Result<DraftRound> {
    let vocab = b.config().text.vocab_size;
    let h = b.config().text.hidden_size;
    let prompt = ids(args.n_prompt.clamp(1, 512), vocab);
    let reps = 20;
    let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
    b.reset();
    let first = *b.prefill_prompt(&prompt, args.model.chunk, Readback::Argmax)?.argmax.last().expect("a row");
    let pos = prompt.len();
    let hidden = b.draft_context().expect("wgpu exposes it").last_hidden()?;
    let hidden = &hidden[hidden.len() - h..];
    // The drafter alone, from a hidden row the host passes (one submission and wait).
    b.draft(first, hidden, pos, k)?;
    let t0 = Instant::now();
    for _ in 0..reps {
        b.draft(first, hidden, pos, k)?;
    }
    let draft_ms = ms(t0);
    // The verify alone (staged rows, never committed).
    let mut toks = ids(k + 1, vocab);
    toks[0] = first;
    b.verify(&toks, pos, false)?;
    let t0 = Instant::now();
    for _ in 0..reps {
        b.verify(&toks, pos, false)?;
    }
    let verify_ms = ms(t0);
    // Whole rounds, each committing its first row (the target's own token: what a round that
    // accepts nothing costs; accepted rows only add K/V copies).
    let v = b.verify(&toks, pos, false)?;
    b.commit(1)?;
    let (mut tok, mut p) = (v.argmax[0], pos + 1);
    let mut round = |b: &mut WgpuBackend| -> anyhow::Result<()> {
        let (_, v) = b.draft_verify(tok, p, k)?.context(
            "rounds on the GPU need every expert resident (streamed experts need the host inside each step): drop --expert-slots or pass --expert-slots all",
        )?;
        b.commit(1)?;
        (tok, p) = (v.argmax[0], p + 1);
        Ok(())
    };
    round(b)?;
    let t0 = Instant::now();
    for _ in 0..reps {
        round(b)?;
    }
    let round_ms = ms(t0);

    let params = crate::engine::GenerateParams {
        max_new: args.n_gen.max(2),
        stop_ids: Vec::new(),
        ignore_eos: true,
        chunk: args.model.chunk,
    };
    let mut sampler = crate::sampler::Sampler::new(crate::sampler::SamplerConfig::default());
    let (g_out, g_stats) = crate::engine::generate(b, &prompt, &params, &mut sampler, |_| Ok(()))?;
    let (s_out, s_stats, stats) = crate::engine::speculative::generate(b, drafter, k, &prompt, &params, |_| Ok(()))?;
    if g_out != s_out {
        bail!("speculative output differs from greedy at k = {k}: a bug, please report it");
    }
    let ahead_round_ms = s_stats.decode_time.as_secs_f64() * 1e3 / stats.target_passes.max(1) as f64;
    Ok(DraftRound {
        k,
        draft_ms,
        verify_ms,
        round_ms,
        ahead_round_ms,
        decode_ms,
        greedy_tok_s: g_stats.decode_tok_s(),
        spec_tok_s: s_stats.decode_tok_s(),
        stats,
    })
}

fn print_rounds(rounds: &[DraftRound], decode_ms: f64) {
    println!("\nspeculative rounds vs one decode step ({decode_ms:.3} ms), drafter on the GPU:");
    let heads: Vec<String> = ACCEPTANCE.iter().map(|a| format!("×@{a:.1}")).collect();
    println!(
        "| k | draft ms | verify ms | round ms, host between | round ms, run ahead | round / decode | {} | measured × | tokens/pass |",
        heads.join(" | ")
    );
    println!("|---|---|---|---|---|---|{}---|---|", "---|".repeat(ACCEPTANCE.len()));
    for r in rounds {
        let exp: Vec<String> = ACCEPTANCE.iter().map(|&a| format!("{:.2}", r.expected_speedup(a))).collect();
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {} | {:.2} | {:.2} |",
            r.k,
            r.draft_ms,
            r.verify_ms,
            r.round_ms,
            r.ahead_round_ms,
            r.round_steps(),
            exp.join(" | "),
            r.spec_tok_s / r.greedy_tok_s,
            r.stats.tokens_per_pass()
        );
    }
    println!("round / decode: a round run ahead (draft k, verify k + 1, accept and commit on the GPU; the host a round behind) over the decode step. Draft and verify alone and the host-driven round each include one host wait.");
    println!("×@a: the speedup a round's cost allows when each draft is accepted with probability a ((1 + a + … + a^k) / round steps); measured ×: speculative over greedy tok/s on the bench prompt, whose acceptance the last column shows.");
}

/// `-r` timed passes of `prompt` in chunks, each from an empty cache: the median, slowest and
/// fastest tok/s.
fn time_prefill(b: &mut dyn Backend, prompt: &[u32], args: &BenchArgs) -> anyhow::Result<(f64, f64, f64)> {
    let mut rates = Vec::new();
    for _ in 0..args.reps {
        b.reset();
        let t0 = Instant::now();
        b.prefill_prompt(prompt, args.model.chunk, Readback::Argmax)?;
        rates.push(prompt.len() as f64 / t0.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok((rates[rates.len() / 2], rates[0], rates[rates.len() - 1]))
}

/// What the backend-neutral bench measures: pp (median, slowest, fastest tok/s), tg (tok/s and
/// seconds per token) and the greedy ids tg produced.
struct Measured {
    device: String,
    pp: Option<(f64, f64, f64)>,
    tg: Option<(f64, f64)>,
    ids: Vec<u32>,
}

/// pp and tg on any backend, as `generate` runs them: the prompt through `prefill_prompt`, then
/// greedy decode of `n` tokens after a context of `--depth` tokens. One untimed pass first.
fn measure(b: &mut dyn Backend, args: &BenchArgs) -> anyhow::Result<Measured> {
    let vocab = b.config().text.vocab_size;
    let depth = args.depth as usize;
    let mut pp = None;
    if args.n_prompt > 0 {
        let prompt = ids(args.n_prompt, vocab);
        b.reset();
        b.prefill_prompt(&prompt, args.model.chunk, Readback::Argmax)?;
        pp = Some(time_prefill(b, &prompt, args)?);
    }
    let mut tg = None;
    let mut out = Vec::new();
    if args.n_gen > 0 {
        b.reset();
        let tok = b.prefill_prompt(&ids(depth, vocab), args.model.chunk, Readback::Argmax)?.argmax[0];
        let t0 = Instant::now();
        b.decode_greedy(tok, depth, args.n_gen, &mut |id| {
            out.push(id);
            Ok(true)
        })?;
        let secs = t0.elapsed().as_secs_f64();
        tg = Some((args.n_gen as f64 / secs, secs / args.n_gen as f64));
    }
    Ok(Measured { device: b.device_info(), pp, tg, ids: out })
}

fn ctx_of(args: &BenchArgs, model: &crate::model::Model) -> anyhow::Result<super::ModelArgs> {
    let max_pos = model.cfg.text.max_position_embeddings;
    let depth = args.depth as usize;
    let ctx = args.model.ctx_for(max_pos).max(args.n_prompt.max(depth) + args.n_gen + 1).min(max_pos);
    if depth + args.n_gen + 1 > ctx || args.n_prompt > ctx {
        bail!(
            "-p {}, --depth {depth} and -n {} need more positions than the model's {max_pos}",
            args.n_prompt,
            args.n_gen
        );
    }
    let mut m = args.model.clone();
    m.ctx = Some(ctx);
    Ok(m)
}

fn measured_json(backend: &str, m: &Measured, args: &BenchArgs) -> serde_json::Value {
    json!({
        "backend": backend,
        "device": m.device,
        "pp": m.pp.map(|(t, lo, hi)| json!({"tokens": args.n_prompt, "tok_s": t, "repetitions": args.reps, "tok_s_min": lo, "tok_s_max": hi})),
        "tg": m.tg.map(|(t, s)| json!({"tokens": args.n_gen, "tok_s": t, "ms_per_token": s * 1e3, "depth": args.depth})),
    })
}

fn print_rows(backend: &str, m: &Measured, args: &BenchArgs) {
    if let Some((t, _, _)) = m.pp {
        println!("| {backend} | pp{} | {t:.2} | {:.3} |", args.n_prompt, 1e3 / t);
    }
    if let Some((t, s)) = m.tg {
        println!("| {backend} | tg{} | {t:.2} | {:.3} |", args.n_gen, s * 1e3);
    }
}

/// `kestrel bench --backend cpu|metal|msl-emu`: pp and tg only (the GPU figures — bytes per
/// token against the copy roofline, per-kernel timestamps, verify and speculative costs — are
/// the wgpu backend's instrumentation).
fn plain(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    if args.list_program || !args.skip.is_empty() || args.draft.is_some() {
        bail!(
            "--list-program, --skip and --draft instrument the wgpu backend: drop them, or use --backend wgpu (this run: --backend {})",
            args.model.backend.name()
        );
    }
    let model = load_model(&args.model)?;
    let margs = ctx_of(args, &model)?;
    let mut b = super::generate::open_backend(&margs, &model)?;
    let m = measure(b.as_mut(), args)?;
    let name = args.model.backend.name();
    if args.json {
        let mut v = measured_json(name, &m, args);
        v["model"] = json!(model.source);
        v["device_weight_bytes"] = json!(b.memory().weight_bytes);
        v["device_state_bytes"] = json!(b.memory().state_bytes);
        println!("{v}");
    } else {
        println!("model: {}   device: {}", model.source, m.device);
        println!("| backend | test | tok/s | ms/token |");
        println!("|---|---|---|---|");
        print_rows(name, &m, args);
    }
    Ok(ExitCode::SUCCESS)
}

/// `kestrel bench --compare A,B`: both backends on the same model in one process, one after the
/// other (never at once: they would share the machine), pp and tg of each, B's rate over A's,
/// and whether their greedy ids agree.
fn compare(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let [a, bk] = args.compare[..] else {
        bail!("--compare takes two backends, e.g. --compare metal,wgpu (got {})", args.compare.len());
    };
    if args.list_program || !args.skip.is_empty() || args.draft.is_some() {
        bail!("--compare measures pp and tg only: drop --list-program, --skip and --draft");
    }
    let model = load_model(&args.model)?;
    let mut results = Vec::new();
    for kind in [a, bk] {
        let mut margs = ctx_of(args, &model)?;
        margs.backend = kind;
        let mut b = super::generate::open_backend(&margs, &model)?;
        results.push((kind.name(), measure(b.as_mut(), args)?));
    }
    let (ra, rb) = (&results[0].1, &results[1].1);
    let agree = ra.ids == rb.ids;
    let first_diff = ra.ids.iter().zip(&rb.ids).position(|(x, y)| x != y);
    let ratio = |x: Option<f64>, y: Option<f64>| x.zip(y).map(|(x, y)| y / x);
    let pp_ratio = ratio(ra.pp.map(|p| p.0), rb.pp.map(|p| p.0));
    let tg_ratio = ratio(ra.tg.map(|t| t.0), rb.tg.map(|t| t.0));
    if args.json {
        let v = json!({
            "model": model.source,
            "backends": results.iter().map(|(n, m)| measured_json(n, m, args)).collect::<Vec<_>>(),
            "pp_ratio": pp_ratio,
            "tg_ratio": tg_ratio,
            "tokens_agree": agree,
            "first_difference": first_diff,
        });
        println!("{v}");
    } else {
        println!("model: {}", model.source);
        for (n, m) in &results {
            println!("{n}: {}", m.device);
        }
        println!("| backend | test | tok/s | ms/token |");
        println!("|---|---|---|---|");
        for (n, m) in &results {
            print_rows(n, m, args);
        }
        let r = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.3}"));
        println!("{} / {}: pp {} ×, tg {} ×", bk.name(), a.name(), r(pp_ratio), r(tg_ratio));
        match (agree, first_diff) {
            (true, _) => println!("greedy tokens: the same {} ids", ra.ids.len()),
            (false, Some(i)) => println!("greedy tokens: DIFFER from position {i}"),
            (false, None) => println!("greedy tokens: DIFFER in length"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
