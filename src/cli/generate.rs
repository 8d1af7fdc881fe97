//! `kestrel generate`: prompt → tokens → streamed text (or one JSON object), stats on stderr.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::json;

use super::{GenerateArgs, ModelArgs};
use crate::backend::cpu::CpuBackend;
use crate::backend::metal::{MetalBackend, MetalOptions};
use crate::backend::wgpu::{DraftModel, WgpuBackend, WgpuOptions};
use crate::backend::{Backend, BackendKind};
use crate::chat::{self, Message};
use crate::engine::speculative;
use crate::engine::{self, GenStats, GenerateParams};
use crate::model::Model;
use crate::sampler::{Sampler, SamplerConfig};
use crate::spec::Drafter;
use crate::streamer::ExpertSlots;
use crate::tokenizer::StreamDecoder;

/// Loads the model named by `--model` (or the embedded one).
pub fn load_model(args: &ModelArgs) -> anyhow::Result<Model> {
    match &args.model {
        Some(dir) => {
            Model::open_with(dir, args.trust_manifest).with_context(|| format!("loading model {}", dir.display()))
        }
        None => Model::embedded().context("loading the embedded model"),
    }
}

/// Builds the backend chosen by `--backend` for `model`.
pub fn open_backend(args: &ModelArgs, model: &Model) -> anyhow::Result<Box<dyn Backend>> {
    open_backend_with(args, model, None)
}

/// [`open_backend`], with the MTP drafter a backend that drafts on its device (wgpu, metal,
/// msl-emu) records or packs beside the target.
pub fn open_backend_with(
    args: &ModelArgs,
    model: &Model,
    drafter: Option<&Drafter>,
) -> anyhow::Result<Box<dyn Backend>> {
    let max_pos = model.cfg.text.max_position_embeddings;
    let ctx = args.ctx_for(max_pos);
    if ctx == 0 || ctx > max_pos {
        bail!("--ctx {ctx} is out of range: the model supports 1..={max_pos} positions");
    }
    if args.chunk == 0 || args.chunk > 1024 {
        bail!("--chunk {} is out of range: use 1..=1024", args.chunk);
    }
    let expert_slots = expert_slots(args, model)?;
    // Validated whichever backend runs: a mistyped setting is an error, not silently unused.
    let tuning = args.tuning()?;
    Ok(match args.backend {
        BackendKind::Cpu => {
            Box::new(CpuBackend::with_experts(model.cfg.clone(), model.weights.clone(), ctx, expert_slots)?)
        }
        BackendKind::Wgpu => {
            if let Some(d) = drafter {
                d.check_target(&model.cfg)?;
            }
            let opts = WgpuOptions {
                max_ctx: ctx,
                max_chunk: args.chunk,
                max_binding: None,
                expert_slots,
                tuning,
                drafter: drafter.map(|d| DraftModel(d.config().clone(), d.weights().clone())),
                ..WgpuOptions::default()
            };
            Box::new(
                WgpuBackend::new(model.cfg.clone(), model.weights.clone(), opts)
                    .context("starting the wgpu backend")?,
            )
        }
        BackendKind::Metal | BackendKind::MslEmu => {
            if let Some(d) = drafter {
                d.check_target(&model.cfg)?;
            }
            let drafter = drafter.map(|d| (d.config().clone(), d.weights().clone()));
            let opts = MetalOptions { max_ctx: ctx, launch: None, expert_slots, drafter };
            let (cfg, w) = (model.cfg.clone(), model.weights.clone());
            if args.backend == BackendKind::Metal {
                Box::new(MetalBackend::on_gpu(cfg, w, opts).context("starting the metal backend")?)
            } else {
                Box::new(MetalBackend::emulated(cfg, w, opts).context("starting the msl-emu backend")?)
            }
        }
    })
}

/// `--expert-slots`, checked against the model: only installations stream experts.
pub fn expert_slots(args: &ModelArgs, model: &Model) -> anyhow::Result<ExpertSlots> {
    match (args.expert_slots, model.weights.expert_files.is_some()) {
        (None, true) => Ok(ExpertSlots::Some(super::DEFAULT_EXPERT_SLOTS)),
        (None, false) | (Some(ExpertSlots::All), _) => Ok(ExpertSlots::All),
        (Some(s), true) => Ok(s),
        (Some(_), false) => bail!(
            "--expert-slots streams experts from an installation, and {} is not one: run `kestrel install {} DIR` and pass --model DIR (or drop --expert-slots to keep every expert resident)",
            model.source,
            model.source
        ),
    }
}

/// Turns the prompt flags into token ids.
fn prompt_ids(args: &GenerateArgs, model: &Model) -> anyhow::Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_ids {
        if ids.is_empty() {
            bail!("--prompt-ids is empty");
        }
        return Ok(ids.clone());
    }
    let tok = model
        .tokenizer
        .as_ref()
        .with_context(|| format!("{} has no tokenizer.json: give the prompt as --prompt-ids", model.source))?;
    let messages = if let Some(path) = &args.messages_file {
        chat::read_messages(path)?
    } else if let Some(text) = &args.prompt {
        if args.raw {
            return Ok(tok.encode(text, true)?);
        }
        let mut m = Vec::new();
        if let Some(s) = &args.system {
            m.push(Message::new("system", s.clone()));
        }
        m.push(Message::new("user", text.clone()));
        m
    } else {
        bail!("no prompt: give --prompt TEXT, --prompt-ids 2,105,... or --messages-file FILE");
    };
    let template = model
        .template
        .as_ref()
        .with_context(|| format!("{} has no chat template: use --raw or --prompt-ids", model.source))?;
    let rendered = template.render(&messages, true, &serde_json::Value::Null)?;
    // The template writes <bos> itself.
    Ok(tok.encode(&rendered, false)?)
}

/// Peak resident memory of this process (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let scfg = SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    };
    scfg.validate()?;
    if args.raw && args.prompt.is_none() {
        bail!("--raw applies to --prompt only");
    }
    let drafter = match &args.draft {
        None => None,
        Some(dir) => {
            if !scfg.is_greedy() {
                bail!("--draft is greedy only (the output equals greedy decoding): drop --temp/--top-k/--top-p/--repetition-penalty");
            }
            if args.draft_k == 0 {
                bail!("--draft-k must be at least 1");
            }
            let m = Model::open(dir).with_context(|| format!("loading drafter {}", dir.display()))?;
            Some(Drafter::from_model(&m).with_context(|| format!("drafter {}", dir.display()))?)
        }
    };
    let model = load_model(&args.model)?;
    let prompt = prompt_ids(&args, &model)?;
    let vocab = model.cfg.text.vocab_size;
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        bail!("prompt token id {bad} is outside the vocabulary (size {vocab})");
    }
    let max_pos = model.cfg.text.max_position_embeddings;
    engine::check_context(prompt.len(), args.max_new, args.model.ctx_for(max_pos), max_pos)?;
    let mut backend = open_backend_with(&args.model, &model, drafter.as_ref())?;

    let params = GenerateParams {
        max_new: args.max_new,
        stop_ids: model.stop_ids.clone(),
        ignore_eos: args.ignore_eos,
        chunk: args.model.chunk,
    };
    let mut sampler = Sampler::new(scfg);
    let mut stream = StreamDecoder::new(true);
    let stdout = std::io::stdout();
    let stream_text = !args.json;
    let tok = model.tokenizer.as_ref();
    let stop_ids = params.stop_ids.clone();
    // A failed stdout write is kept as the bare io::Error, so that main sees a closed pipe
    // (`kestrel generate … | head`) and exits 0.
    let mut stdout_err: Option<std::io::Error> = None;
    let mut spec_stats = None;
    let on_token = |id| {
        if stream_text && !stop_ids.contains(&id) {
            if let Some(t) = tok {
                let piece = stream.push(t, id)?;
                let mut out = stdout.lock();
                if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                    let msg = format!("writing to stdout: {e}");
                    stdout_err = Some(e);
                    return Err(crate::Error::Invalid(msg));
                }
            }
        }
        Ok(())
    };
    let result = match &drafter {
        None => engine::generate(backend.as_mut(), &prompt, &params, &mut sampler, on_token),
        Some(d) => {
            speculative::generate(backend.as_mut(), d, args.draft_k, &prompt, &params, on_token).map(|(t, s, sp)| {
                spec_stats = Some(sp);
                (t, s)
            })
        }
    };
    if let Some(e) = stdout_err {
        return Err(anyhow::Error::new(e).context("writing to stdout"));
    }
    let (tokens, stats) = result?;
    let text_ids: Vec<u32> = tokens.iter().copied().filter(|id| !stop_ids.contains(id)).collect();
    let text = match tok {
        Some(t) => t.decode(&text_ids, true)?,
        None => String::new(),
    };
    if stream_text {
        let mut out = stdout.lock();
        if let Some(t) = tok {
            out.write_all(stream.finish(t)?.as_bytes())?;
        } else {
            // No tokenizer: the ids are the output.
            let ids: Vec<String> = tokens.iter().map(|i| i.to_string()).collect();
            out.write_all(ids.join(" ").as_bytes())?;
        }
        out.write_all(b"\n")?;
        out.flush()?;
    }
    let mem = backend.memory();
    let peak = peak_rss_bytes();
    print_stats(&stats, backend.as_ref(), peak);
    if let Some(s) = &spec_stats {
        let acc: Vec<String> = s
            .acceptance()
            .iter()
            .zip(&s.proposed)
            .map(|(a, &p)| if p == 0 { "-".into() } else { format!("{:.0}%", 100.0 * a) })
            .collect();
        eprintln!(
            "[speculative] k={} | {} target passes, {:.2} tokens/pass | acceptance by draft position: {}",
            s.k,
            s.target_passes,
            s.tokens_per_pass(),
            acc.join(" ")
        );
    }
    if args.json {
        let obj = json!({
            "tokens": tokens,
            "text": text,
            "stats": {
                "backend": backend.name(),
                "device": backend.device_info(),
                "model": model.source,
                "prompt_tokens": stats.prompt_tokens,
                "prompt_seconds": stats.prompt_time.as_secs_f64(),
                "prompt_tok_s": stats.prompt_tok_s(),
                "generated_tokens": stats.generated_tokens,
                "decode_seconds": stats.decode_time.as_secs_f64(),
                "decode_tok_s": stats.decode_tok_s(),
                "finish_reason": stats.finish_reason,
                "peak_rss_bytes": peak,
                "device_weight_bytes": mem.weight_bytes,
                "device_state_bytes": mem.state_bytes,
                "experts": stats.experts.map(|e| e.to_json()),
                "speculative": spec_stats.as_ref().map(|s| s.to_json()),
                "tuning": backend.tuning().map(|t| t.to_json()),
            }
        });
        // Not println!: it panics when the reader has gone away.
        let mut out = stdout.lock();
        writeln!(out, "{obj}")?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stats(s: &GenStats, b: &dyn Backend, peak: Option<u64>) {
    let mem = b.memory();
    eprintln!(
        "[{} on {}] prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s ({}) | peak RSS {:.1} MiB, device {:.1} MiB weights + {:.1} MiB state",
        b.name(),
        b.device_info(),
        s.prompt_tokens,
        s.prompt_tok_s(),
        s.generated_tokens,
        s.decode_tok_s(),
        s.finish_reason,
        peak.unwrap_or(0) as f64 / 1048576.0,
        mem.weight_bytes as f64 / 1048576.0,
        mem.state_bytes as f64 / 1048576.0,
    );
    if let Some(e) = &s.experts {
        eprintln!(
            "[experts] hit rate {:.1}% ({} hits, {} misses, {} evictions) | read {:.2} MiB/token, I/O {:.2} ms/token",
            100.0 * e.hit_rate(),
            e.hits,
            e.misses,
            e.evictions,
            e.bytes_per_token() / 1048576.0,
            e.io_ms_per_token()
        );
    }
}
