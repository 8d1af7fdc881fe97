//! Speculative decoding with the Gemma 4 MTP drafter (`gemma4_assistant`, spec §3).
//!
//! The drafter has no KV cache of its own: every step reads the target's K/V of two producer
//! layers and the target's post-final-norm hidden state. [`DraftContext`] is what a target
//! backend exposes for that (the CPU backend implements it; a GPU backend would implement it by
//! readback), so the [`drafter::Drafter`] itself stays backend-independent.
//!
//! The speculative loop (draft, verify, accept, commit) is the engine's
//! (`crate::engine::speculative`); verification and commit are `Backend` methods.

pub mod drafter;

use std::ops::Range;

use crate::config::AttnKind;
use crate::error::Result;

pub use drafter::{DraftKv, DraftStep, Drafter, StepInput};

/// K and V rows of one target layer for a run of consecutive positions, as the target caches
/// them: K post-k_norm post-RoPE, V post-v_norm, each `[row][n_kv_heads * head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct KvRows {
    /// The absolute position of row 0 (for messages; attention only needs the rows).
    pub start: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvRows {
    /// Number of positions held.
    pub fn len(&self) -> usize {
        self.k.len().checked_div(self.n_kv_heads * self.head_dim).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// K of `row`, kv head `head` (`head_dim` values).
    pub fn k_head(&self, row: usize, head: usize) -> &[f32] {
        let at = (row * self.n_kv_heads + head) * self.head_dim;
        &self.k[at..at + self.head_dim]
    }
    /// V of `row`, kv head `head`.
    pub fn v_head(&self, row: usize, head: usize) -> &[f32] {
        let at = (row * self.n_kv_heads + head) * self.head_dim;
        &self.v[at..at + self.head_dim]
    }
}

/// What the drafter reads from the target. Owned results, so that a GPU backend can implement
/// it with a readback.
pub trait DraftContext {
    /// The target's hidden size (the drafter's `backbone_hidden_size`).
    fn hidden_size(&self) -> usize;

    /// Positions currently in the target's KV cache (`0..cached_len()`).
    fn cached_len(&self) -> usize;

    /// The target's scaled input embedding of `token`: `embed_tokens[token] · √H` (f32(√H)
    /// here; transformers in bf16 would use bf16(√H)).
    fn token_embedding(&self, token: u32) -> Result<Vec<f32>>;

    /// K/V rows for `positions` of the target's producer layer of `kind`: the last layer of that
    /// attention kind that owns a cache (spec §3.2).
    fn producer_kv(&self, kind: AttnKind, positions: Range<usize>) -> Result<KvRows>;

    /// Post-final-norm hidden states of the target's last step, `[rows][hidden]`, one row per
    /// token of that step (step 0 of a round uses the row that produced the token being fed).
    fn last_hidden(&self) -> Result<Vec<f32>>;
}
