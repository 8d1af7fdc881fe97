//! The step-shaped [`Backend`] trait and the backends behind it.
//!
//! One method per *step* of generation, not per operation: a backend receives "run these tokens
//! at these positions" and returns what the caller asked to read back. That is the granularity a
//! whole-step megakernel (the Metal backend) can implement with one launch, and it keeps every
//! backend-specific detail (buffers, kernels, barriers) behind the trait. Per-operation code
//! lives inside each backend; the math they are all judged by is `crate::reference`.
//!
//! Speculative decoding adds `verify` (score the last accepted token and k drafts in one pass,
//! their K/V staged, not cached) and `commit` (keep the first n staged rows); backends that
//! draft also expose a [`DraftContext`](crate::spec::DraftContext).

pub mod cpu;
pub mod metal;
pub mod wgpu;

use crate::config::Config;
use crate::error::Result;

/// What [`Backend::speculate`] calls with each round's drafts and its verify's argmax; returns
/// whether to go on.
pub type OnRound<'a> = &'a mut dyn FnMut(&[u32], &[u32]) -> Result<bool>;

/// What a step reads back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readback {
    /// Only the argmax token of the last row (4 bytes: the greedy fast path).
    Argmax,
    /// Argmax and the logits of the last row.
    LastLogits,
    /// Argmax and logits of every row of the step (tests, teacher forcing, verification).
    AllLogits,
    /// Nothing: the step only appends its K/V to the cache (a long prompt's chunks before the
    /// last), so a backend may skip what only the logits need.
    Nothing,
}

/// What a step returns.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Greedy token of each row read back (one for `Argmax`/`LastLogits`, one per row for
    /// `AllLogits`, none for `Nothing`).
    pub argmax: Vec<u32>,
    /// Logits `[rows, vocab]`, row-major, after the final softcap; empty for `Argmax`.
    pub logits: Vec<f32>,
}

/// Memory a backend holds, for the stats line.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryUse {
    /// Bytes of weights resident on the device (or in host memory for the CPU backend).
    pub weight_bytes: u64,
    /// Bytes of KV cache and activation buffers.
    pub state_bytes: u64,
}

/// A device that runs the Gemma 4 forward pass.
///
/// Positions are absolute token indices. A backend holds the KV cache of one sequence; callers
/// advance it monotonically (`prefill` chunks, then `decode` steps) or `reset` it.
pub trait Backend {
    /// Short name for stats and errors (`wgpu`, `cpu`).
    fn name(&self) -> &str;

    /// A description of the device (adapter name, driver).
    fn device_info(&self) -> String;

    fn config(&self) -> &Config;

    /// Largest number of tokens one `prefill` call accepts.
    fn max_chunk(&self) -> usize;

    /// Largest absolute position + 1 the cache holds.
    fn max_context(&self) -> usize;

    /// Runs `tokens` (at most [`Backend::max_chunk`]) at positions `pos..pos + tokens.len()`,
    /// appending their K/V to the cache. `Argmax` and `LastLogits` read back the last row only.
    fn prefill(&mut self, tokens: &[u32], pos: usize, readback: Readback) -> Result<StepOutput>;

    /// Runs a whole prompt from position 0 in chunks of at most `chunk` tokens (and
    /// [`Backend::max_chunk`]) and returns the last chunk's output, read back as `last`. The
    /// chunks before it read back `Nothing`: they only fill the cache, so a backend may skip
    /// what only the logits need.
    fn prefill_prompt(&mut self, prompt: &[u32], chunk: usize, last: Readback) -> Result<StepOutput> {
        if prompt.is_empty() {
            return Err(crate::Error::Invalid("prefill of an empty prompt".into()));
        }
        let chunk = chunk.clamp(1, self.max_chunk());
        let mut pos = 0;
        let mut out = StepOutput::default();
        for piece in prompt.chunks(chunk) {
            let rb = if pos + piece.len() < prompt.len() { Readback::Nothing } else { last };
            out = self.prefill(piece, pos, rb)?;
            pos += piece.len();
        }
        Ok(out)
    }

    /// Runs one token at position `pos`. Equivalent to a one-token `prefill`, but backends keep
    /// a dedicated, allocation-free path for it.
    fn decode(&mut self, token: u32, pos: usize, readback: Readback) -> Result<StepOutput> {
        self.prefill(&[token], pos, readback)
    }

    /// Greedy decode: runs `token` at `pos`, then each step's argmax at the next position,
    /// handing every new id to `on_token` until it returns `false` or `max` ids were produced;
    /// returns how many were. A backend may start the next step before the host has seen an id
    /// (the id stays on the device); the cache then holds the positions of the ids handed out,
    /// as if each had been a [`decode`](Backend::decode).
    fn decode_greedy(
        &mut self,
        token: u32,
        pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<usize> {
        greedy_steps(self, token, pos, max, on_token)
    }

    /// Forgets the sequence (the cache contents become unused).
    fn reset(&mut self);

    fn memory(&self) -> MemoryUse;

    /// Scores `tokens` (the last accepted token, then the drafts) at positions `pos..`, and
    /// returns the argmax of every row (and every row's logits when `with_logits`). Each row's
    /// logits are bitwise those a one-token `decode` at that position would give. Their K/V go
    /// to a staging area: the cache is untouched until [`commit`](Backend::commit).
    fn verify(&mut self, tokens: &[u32], pos: usize, with_logits: bool) -> Result<StepOutput> {
        let _ = (tokens, pos, with_logits);
        Err(crate::Error::Invalid(format!("the {} backend cannot verify drafts (speculative decoding)", self.name())))
    }

    /// Most tokens one `verify` accepts (the last accepted token plus drafts).
    fn max_verify(&self) -> usize {
        0
    }

    /// Appends the first `n` staged K/V rows of the last `verify` to the cache and drops the
    /// rest.
    fn commit(&mut self, n: usize) -> Result<()> {
        let _ = n;
        Err(crate::Error::Invalid(format!("the {} backend cannot commit drafts (speculative decoding)", self.name())))
    }

    /// What the MTP drafter reads from this target (K/V of the producer layers, hidden states).
    fn draft_context(&self) -> Option<&dyn crate::spec::DraftContext> {
        None
    }

    /// The kernel and program choices this backend was built with, where it has any (the GPU
    /// backends).
    fn tuning(&self) -> Option<&crate::kernels::Tuning> {
        None
    }

    /// Drafts `k` tokens with the MTP drafter this backend was built with, on its device: `token`
    /// fed at `pos` (the committed length) with `hidden`, the target's post-final-norm hidden
    /// state of the row that produced `token`. `None` when the backend has no drafter of its own
    /// (the engine then runs the host drafter, `crate::spec::Drafter`).
    fn draft(&mut self, token: u32, hidden: &[f32], pos: usize, k: usize) -> Result<Option<Vec<u32>>> {
        let _ = (token, hidden, pos, k);
        Ok(None)
    }

    /// One speculative round on the device, for a backend built with a drafter: drafts `k`
    /// tokens from `token` (at `pos`, the committed length) and the hidden row of the step that
    /// produced it, kept on the device, then verifies `[token, drafts]` as [`Backend::verify`]
    /// does (commit follows), the host waiting once. Returns the drafts and the verify's argmax.
    /// `None`: no device drafter here (the engine drafts, then calls `verify`).
    fn draft_verify(&mut self, token: u32, pos: usize, k: usize) -> Result<Option<(Vec<u32>, StepOutput)>> {
        let _ = (token, pos, k);
        Ok(None)
    }

    /// Speculative rounds of `k` drafts from `token` at `pos` (the committed length) that the
    /// device drafts, verifies and accepts itself, each round recorded and submitted before the
    /// host has read the one before. `on_round(drafts, argmax)` sees every round's drafts and its
    /// verify's argmax in order (the caller accepts by the same rule: the longest prefix of drafts
    /// equal to the argmax, then the target's token) and returns whether to go on. Afterwards the
    /// cache holds exactly the accepted positions of the rounds handed out. The caller leaves
    /// room in the context for two rounds past the last token it wants. `None`: not offered here
    /// (the engine runs its own loop).
    fn speculate(&mut self, token: u32, pos: usize, k: usize, on_round: OnRound<'_>) -> Result<Option<usize>> {
        let _ = (token, pos, k, on_round);
        Ok(None)
    }

    /// Expert-streaming figures (hit rate, bytes read), when MoE experts stream from disk.
    fn stream_stats(&self) -> Option<crate::streamer::StreamStats> {
        None
    }
}

/// Which backend to build, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Wgpu,
    Cpu,
    /// The raw-MSL kernels on an Apple GPU.
    Metal,
    /// The same MSL kernels compiled for the CPU (cross-checking; slow).
    MslEmu,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "wgpu" => Ok(BackendKind::Wgpu),
            "cpu" => Ok(BackendKind::Cpu),
            "metal" => Ok(BackendKind::Metal),
            "msl-emu" => Ok(BackendKind::MslEmu),
            other => Err(format!(
                "unknown backend `{other}`: choose `wgpu` (GPU), `metal` (Apple GPU, raw MSL), `msl-emu` (the MSL kernels on the CPU) or `cpu` (f32 reference)"
            )),
        }
    }
}

impl BackendKind {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cpu => "cpu",
            BackendKind::Metal => "metal",
            BackendKind::MslEmu => "msl-emu",
        }
    }
}

/// Greedy decode one `decode` step at a time: the default [`Backend::decode_greedy`], and the
/// path of backends that cannot run ahead in some configuration.
pub fn greedy_steps<B: Backend + ?Sized>(
    b: &mut B,
    token: u32,
    pos: usize,
    max: usize,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<usize> {
    let mut tok = token;
    for i in 0..max {
        let out = b.decode(tok, pos + i, Readback::Argmax)?;
        tok = *out.argmax.last().ok_or_else(|| crate::Error::Gpu("a decode step read back no argmax".into()))?;
        if !on_token(tok)? {
            return Ok(i + 1);
        }
    }
    Ok(max)
}
