//! The speculative-decoding loop, shared by every backend: draft k tokens with the MTP drafter,
//! score `[last accepted, d1..dk]` in one target pass (`Backend::verify`), accept the longest
//! prefix of drafts equal to the target's own argmax plus the target's next token (the "bonus"),
//! and commit exactly the accepted rows' K/V (`Backend::commit`).
//!
//! Greedy only. The output is plain greedy decoding's by construction: every emitted token is the
//! target's argmax at its position, computed from the same committed cache with logits bitwise
//! equal to a one-token decode (the backends guarantee it; tests/speculative.rs checks it). The
//! drafter only decides how many of them one target pass yields.

use std::time::Instant;

use super::{check_context, GenStats, GenerateParams};
use crate::backend::{Backend, Readback};
use crate::error::{Error, Result};
use crate::spec::Drafter;

/// Acceptance figures of one generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Drafts per round asked for.
    pub k: usize,
    /// Verify passes of the target.
    pub target_passes: usize,
    /// `proposed[j]`: rounds that proposed a draft at position j (0-based); `accepted[j]`: of those,
    /// rounds whose draft j was accepted.
    pub proposed: Vec<usize>,
    pub accepted: Vec<usize>,
    /// Tokens emitted by verify rounds (accepted drafts + bonus tokens).
    pub round_tokens: usize,
    /// For each emitted token: whether it was an accepted draft (else the target's own token:
    /// the first one, or a round's bonus).
    pub from_draft: Vec<bool>,
}

impl SpecStats {
    /// Acceptance rate per draft position.
    pub fn acceptance(&self) -> Vec<f64> {
        self.proposed
            .iter()
            .zip(&self.accepted)
            .map(|(&p, &a)| if p == 0 { 0.0 } else { a as f64 / p as f64 })
            .collect()
    }
    /// Tokens each target verify pass produced on average.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.target_passes == 0 {
            0.0
        } else {
            self.round_tokens as f64 / self.target_passes as f64
        }
    }
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "k": self.k,
            "target_passes": self.target_passes,
            "tokens_per_pass": self.tokens_per_pass(),
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance": self.acceptance(),
        })
    }
}

/// Greedy generation of up to `params.max_new` tokens after `prompt`, drafting `k` tokens per
/// round. Same contract as [`crate::engine::generate`] (and the same tokens).
pub fn generate(
    backend: &mut dyn Backend,
    drafter: &Drafter,
    k: usize,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: impl FnMut(u32) -> Result<()>,
) -> Result<(Vec<u32>, GenStats, SpecStats)> {
    if k == 0 {
        return Err(Error::Invalid("--draft-k must be at least 1".into()));
    }
    drafter.check_target(backend.config())?;
    if backend.draft_context().is_none() {
        return Err(Error::Invalid(format!(
            "the {} backend does not expose its K/V to a drafter yet: use --backend cpu with --draft",
            backend.name()
        )));
    }
    let cfg_max = backend.config().text.max_position_embeddings;
    let max_ctx = backend.max_context();
    check_context(prompt.len(), params.max_new, max_ctx, cfg_max)?;
    let mut stats = GenStats { prompt_tokens: prompt.len(), finish_reason: "length", ..Default::default() };
    let spec = SpecStats { k, proposed: vec![0; k], accepted: vec![0; k], ..Default::default() };
    let out = Vec::with_capacity(params.max_new);
    if params.max_new == 0 {
        return Ok((out, stats, spec));
    }
    backend.reset();
    let streamed_before = backend.stream_stats();

    // ---- prefill, in chunks; the last chunk's last row is the first token
    let t0 = Instant::now();
    let next =
        *backend.prefill_prompt(prompt, params.chunk, Readback::Argmax)?.argmax.last().expect("one argmax per step");
    let pos = prompt.len();
    stats.prompt_time = t0.elapsed();
    let h = backend.config().text.hidden_size;

    let t1 = Instant::now();
    let mut run = Run { params, on_token, out, stats, spec, pos, next, hidden_row: None, done: false };
    run.spec.from_draft.push(false);
    run.done = run.emit(next)?;
    // Rounds the backend runs ahead on its device (drafting, verifying and accepting there),
    // where it offers them; they stop early only at the end of the context, where the loop
    // below takes over.
    if !run.done && k < backend.max_verify() {
        backend.speculate(next, pos, k, &mut |drafts, argmax| {
            run.round(drafts, argmax)?;
            Ok(!run.done)
        })?;
    }
    while !run.done {
        let (pos, next) = (run.pos, run.next);
        // `next` sits at `pos` (not yet in the cache). Draft no more than the tokens still
        // wanted and the cache can hold (the last verified row needs no slot afterwards).
        let room = max_ctx.saturating_sub(pos + 1);
        let kk = k.min(params.max_new - run.out.len()).min(room).min(backend.max_verify().saturating_sub(1));
        // The backend's own device drafter (built from the same drafter model) drafts and
        // verifies in one go where it can; else the drafts come first, then the verify.
        let on_device = if kk == 0 { None } else { backend.draft_verify(next, pos, kk)? };
        let (drafts, v) = match on_device {
            Some(round) => round,
            None => {
                let drafts: Vec<u32> = if kk == 0 {
                    Vec::new()
                } else {
                    let hidden = hidden_of(backend, h, run.hidden_row)?;
                    match backend.draft(next, &hidden, pos, kk)? {
                        Some(d) => d,
                        None => {
                            let ctx = backend.draft_context().expect("checked above");
                            drafter.draft_block(ctx, next, &hidden, pos, kk)?.into_iter().map(|s| s.token).collect()
                        }
                    }
                };
                let mut tokens = Vec::with_capacity(kk + 1);
                tokens.push(next);
                tokens.extend_from_slice(&drafts);
                let v = backend.verify(&tokens, pos, false)?;
                (drafts, v)
            }
        };
        let n = run.round(&drafts, &v.argmax)?;
        backend.commit(n + 1)?;
    }
    let Run { out, mut stats, spec, .. } = run;
    stats.decode_time = t1.elapsed();
    stats.generated_tokens = out.len();
    stats.experts = super::streamed_since(backend, streamed_before);
    Ok((out, stats, spec))
}

/// A generation's progress through its rounds: the tokens out, the figures, and where the
/// target stands.
struct Run<'p, F> {
    params: &'p GenerateParams,
    on_token: F,
    out: Vec<u32>,
    stats: GenStats,
    spec: SpecStats,
    /// Where `next` sits (the committed length).
    pos: usize,
    /// The target's last token, not yet in the cache.
    next: u32,
    /// The row of the target's last step whose hidden produced `next` (None: its last row); read
    /// back only for a drafter that is not the backend's own.
    hidden_row: Option<usize>,
    /// A stop id or max_new reached.
    done: bool,
}

impl<F: FnMut(u32) -> Result<()>> Run<'_, F> {
    /// Hands out `tok`; true when generation is over (a stop id or max_new).
    fn emit(&mut self, tok: u32) -> Result<bool> {
        self.out.push(tok);
        (self.on_token)(tok)?;
        if !self.params.ignore_eos && self.params.stop_ids.contains(&tok) {
            self.stats.finish_reason = "stop";
            return Ok(true);
        }
        Ok(self.out.len() >= self.params.max_new)
    }

    /// Accepts one round: the longest prefix of `drafts` equal to the target's `argmax`, then the
    /// target's own token after it. Returns the matched count n, whose n + 1 rows the target
    /// commits. Drafts past the tokens still wanted (a round run ahead drafts a full k) are
    /// neither counted nor handed out.
    fn round(&mut self, drafts: &[u32], argmax: &[u32]) -> Result<usize> {
        let wanted = drafts.len().min(self.params.max_new - self.out.len());
        let matched = drafts.iter().zip(argmax).take_while(|(d, t)| d == t).count();
        let n = matched.min(wanted);
        self.spec.target_passes += 1;
        for j in 0..wanted {
            self.spec.proposed[j] += 1;
            if j < n {
                self.spec.accepted[j] += 1;
            }
        }
        self.hidden_row = Some(matched);
        self.pos += matched + 1;
        self.next = argmax[matched];
        for (j, &tok) in drafts[..n].iter().chain(std::iter::once(&argmax[n])).enumerate() {
            self.spec.round_tokens += 1;
            self.spec.from_draft.push(j < n);
            self.done = self.emit(tok)?;
            if self.done {
                break;
            }
        }
        Ok(matched)
    }
}

/// Row `row` (None: the last) of the target's last step's hidden states, read back.
fn hidden_of(backend: &dyn Backend, h: usize, row: Option<usize>) -> Result<Vec<f32>> {
    let rows = backend.draft_context().expect("checked by the caller").last_hidden()?;
    let r = match row {
        Some(r) => r,
        None => (rows.len() / h)
            .checked_sub(1)
            .ok_or_else(|| Error::Invalid("the target kept no hidden state after prefill".into()))?,
    };
    rows.get(r * h..(r + 1) * h)
        .map(<[f32]>::to_vec)
        .ok_or_else(|| Error::Invalid(format!("the target's last step kept no hidden row {r}")))
}
