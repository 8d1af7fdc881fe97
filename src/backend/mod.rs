//! The step-shaped [`Backend`] trait and the backends behind it.
//!
//! One method per *step* of generation, not per operation: a backend receives "run these tokens
//! at these positions" and returns what the caller asked to read back. That is the granularity a
//! whole-step megakernel (the Metal backend) can implement with one launch, and it keeps every
//! backend-specific detail (buffers, kernels, barriers) behind the trait. Per-operation code
//! lives inside each backend: `cpu::ops` is the f32 oracle the kernels are tested against.
//!
//! Speculative decoding will add `verify` (score k+1 tokens in one pass) and `commit` (move
//! accepted K/V rows from staging into the cache); they are not part of this trait yet.

pub mod cpu;
pub mod wgpu;

use crate::config::Config;
use crate::error::Result;

/// What a step reads back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readback {
    /// Only the argmax token of the last row (4 bytes: the greedy fast path).
    Argmax,
    /// Argmax and the logits of the last row.
    LastLogits,
    /// Argmax and logits of every row of the step (tests, teacher forcing, verification).
    AllLogits,
}

/// What a step returns.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Greedy token of each row read back (one for `Argmax`/`LastLogits`, one per row for `AllLogits`).
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

    /// Runs one token at position `pos`. Equivalent to a one-token `prefill`, but backends keep
    /// a dedicated, allocation-free path for it.
    fn decode(&mut self, token: u32, pos: usize, readback: Readback) -> Result<StepOutput> {
        self.prefill(&[token], pos, readback)
    }

    /// Forgets the sequence (the cache contents become unused).
    fn reset(&mut self);

    fn memory(&self) -> MemoryUse;

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
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "wgpu" => Ok(BackendKind::Wgpu),
            "cpu" => Ok(BackendKind::Cpu),
            "metal" => Err("backend `metal` is not built yet: use `--backend wgpu` (Vulkan, Metal or DX12 through WGSL)".into()),
            other => Err(format!("unknown backend `{other}`: choose `wgpu` (GPU) or `cpu` (f32 reference)")),
        }
    }
}
