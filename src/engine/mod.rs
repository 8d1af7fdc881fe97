//! The generation loop shared by every backend: chunked prefill, then one decode step per token,
//! sampling, stop ids, and timing. Nothing here knows which device runs the steps.

pub mod speculative;

use std::time::{Duration, Instant};

use crate::backend::{Backend, Readback};
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::streamer::StreamStats;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Upper bound on generated tokens (the stop token, if any, counts).
    pub max_new: usize,
    /// Ids that end generation (they are included in the output, as transformers does).
    pub stop_ids: Vec<u32>,
    /// Keep going past stop ids (benchmarks, fixtures).
    pub ignore_eos: bool,
    /// Prefill chunk size in tokens (capped by the backend's `max_chunk`).
    pub chunk: usize,
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    /// Time from the first decode step to the last token (excludes prefill).
    pub decode_time: Duration,
    /// Why generation ended: `stop` (a stop id) or `length` (max_new reached).
    pub finish_reason: &'static str,
    /// Expert streaming over this generation (MoE installations with a bounded slot cache).
    pub experts: Option<StreamStats>,
}

impl GenStats {
    pub fn prompt_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_time)
    }
    /// Decode rate: tokens produced by decode steps (all but the first, which prefill yields).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if n == 0 || t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// Checks that `prompt_len + max_new` fits the backend's context before any work starts.
/// The expert-streaming figures of this generation only: the backend's counters are cumulative,
/// `before` is what they were when it started.
pub fn streamed_since<B: Backend + ?Sized>(backend: &B, before: Option<StreamStats>) -> Option<StreamStats> {
    match (backend.stream_stats(), before) {
        (Some(now), Some(before)) => Some(now.since(&before)),
        (now, _) => now,
    }
}

pub fn check_context(prompt_len: usize, max_new: usize, ctx: usize, model_max: usize) -> Result<()> {
    if prompt_len == 0 {
        return Err(Error::Invalid("the prompt is empty: give --prompt, --prompt-ids or --messages-file".into()));
    }
    // The last generated token is never fed back, so it needs no cache slot.
    if prompt_len + max_new.saturating_sub(1) > ctx {
        return Err(Error::ContextOverflow { prompt: prompt_len, max_new, ctx, model_max });
    }
    Ok(())
}

/// Runs `prompt` through `backend` and generates up to `params.max_new` tokens, calling
/// `on_token` with each new id as soon as it is known (for streaming).
pub fn generate(
    backend: &mut dyn Backend,
    prompt: &[u32],
    params: &GenerateParams,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<(Vec<u32>, GenStats)> {
    let cfg_max = backend.config().text.max_position_embeddings;
    check_context(prompt.len(), params.max_new, backend.max_context(), cfg_max)?;
    let mut stats = GenStats { prompt_tokens: prompt.len(), finish_reason: "length", ..Default::default() };
    let mut out = Vec::with_capacity(params.max_new);
    if params.max_new == 0 {
        return Ok((out, stats));
    }
    backend.reset();
    let streamed_before = backend.stream_stats();
    let greedy = sampler.config().is_greedy();
    let last_readback = if greedy { Readback::Argmax } else { Readback::LastLogits };
    let mut history: Vec<u32> = prompt.to_vec();

    // ---- prefill, in chunks
    let t0 = Instant::now();
    let step = backend.prefill_prompt(prompt, params.chunk, last_readback)?;
    let mut pos = prompt.len();
    let mut next = pick(sampler, greedy, step, &history);
    stats.prompt_time = t0.elapsed();

    // ---- decode, one token per step
    let t1 = Instant::now();
    let stop = |id: u32| !params.ignore_eos && params.stop_ids.contains(&id);
    out.push(next);
    on_token(next)?;
    if stop(next) {
        stats.finish_reason = "stop";
    } else if greedy {
        // Greedy ids never leave the device between steps: the backend may run ahead.
        let first = next;
        let remaining = params.max_new - 1;
        backend.decode_greedy(first, pos, remaining, &mut |id| {
            out.push(id);
            on_token(id)?;
            if stop(id) {
                stats.finish_reason = "stop";
                return Ok(false);
            }
            Ok(out.len() < params.max_new)
        })?;
    } else {
        history.push(next);
        while out.len() < params.max_new {
            let step = backend.decode(next, pos, last_readback)?;
            pos += 1;
            next = pick(sampler, greedy, step, &history);
            out.push(next);
            history.push(next);
            on_token(next)?;
            if stop(next) {
                stats.finish_reason = "stop";
                break;
            }
        }
    }
    stats.decode_time = t1.elapsed();
    stats.generated_tokens = out.len();
    stats.experts = streamed_since(backend, streamed_before);
    Ok((out, stats))
}

fn pick(sampler: &mut Sampler, greedy: bool, mut step: crate::backend::StepOutput, history: &[u32]) -> u32 {
    if greedy {
        *step.argmax.last().expect("a step reads back at least one argmax")
    } else {
        sampler.sample(&mut step.logits, history)
    }
}
