//! One step of the Gemma 4 MTP drafter in f32 (spec §3.1–3.4, Appendix B), the reference a GPU
//! drafter will be tested against.
//!
//! A step maps (the target's scaled embedding of the last token, a backbone-width hidden state,
//! a query position, the target's K/V) to a greedy draft token and the drafter's projected
//! hidden (`post_projection` output), which is the hidden input of the next step. All steps of
//! a block use the same position and the same target K/V: the drafter writes no cache.
//!
//! Written with the reference math (`crate::reference`: f64 sums, the same rope tables) so
//! that it reads like the target's reference forward, and so that its differences from
//! transformers are rounding only.

use std::ops::Range;
use std::sync::Arc;

use super::{DraftContext, KvRows};
use crate::config::{AttnKind, Config, ModelKind};
use crate::error::{Error, Result};
use crate::loader::{AssistantWeights, Matrix, ModelWeights};
use crate::model::Model;
use crate::reference::{self, argmax};

/// The target K/V one drafting block attends to: the rows of the last cache-owning sliding layer
/// and of the last cache-owning full layer, already restricted to the visible positions.
#[derive(Debug, Clone, Default)]
pub struct DraftKv {
    pub sliding: KvRows,
    pub full: KvRows,
}

impl DraftKv {
    /// Target positions visible to a drafter query at position `p`, for a drafter whose sliding
    /// window is `window`.
    ///
    /// Full layers: every target position before `p` (`0..p`). The token at `p` is the one being
    /// fed, so the target has not cached it (transformers slices the shared K/V to
    /// `len(input_ids) = p + 1` entries, of which only `p` exist after prefill).
    ///
    /// Sliding layers: the last `window + 1` of those, `p − W − 1 .. p`. transformers builds the
    /// drafter's sliding mask as a bidirectional `|q − kv| ≤ W` window from query index 0 and
    /// flips it along the kv axis (spec §3.2), which leaves W + 1 entries, one more than the
    /// target's own causal window (a query sees itself and W − 1 earlier keys). The fixtures
    /// (prompts of 30 and 40 tokens, W = 16) only match with W + 1, so that is what we use.
    ///
    /// transformers matches these ranges only in the first round after prefill. In later rounds
    /// it slices the verification pass's K/V, which already holds the rejected drafts: its full
    /// layers then also see position `p`, and its sliding window can reach rejected drafts
    /// (spec §3.5). Kestrel keeps to committed positions `< p` in every round.
    pub fn visible(kind: AttnKind, p: usize, window: usize) -> Range<usize> {
        match kind {
            AttnKind::Full => 0..p,
            AttnKind::Sliding => p.saturating_sub(window + 1)..p,
        }
    }

    /// Reads the visible K/V for a query at `p` from the target.
    pub fn gather(ctx: &dyn DraftContext, p: usize, window: usize) -> Result<Self> {
        if p == 0 || p > ctx.cached_len() {
            return Err(Error::Invalid(format!(
                "draft position {p} needs target K/V for positions 0..{p}, the target holds 0..{}",
                ctx.cached_len()
            )));
        }
        Ok(DraftKv {
            sliding: ctx.producer_kv(AttnKind::Sliding, Self::visible(AttnKind::Sliding, p, window))?,
            full: ctx.producer_kv(AttnKind::Full, Self::visible(AttnKind::Full, p, window))?,
        })
    }

    fn of(&self, kind: AttnKind) -> &KvRows {
        match kind {
            AttnKind::Sliding => &self.sliding,
            AttnKind::Full => &self.full,
        }
    }
}

/// The inputs of one draft step.
pub struct StepInput<'a> {
    /// The target's scaled embedding of the last token (`backbone_hidden_size` values).
    pub embedding: &'a [f32],
    /// Step 0: the target's post-final-norm hidden at the position that produced that token;
    /// later steps: the previous step's [`DraftStep::hidden`].
    pub hidden: &'a [f32],
    /// Query position: the position of the token being fed (constant within a block).
    pub position: usize,
    pub kv: &'a DraftKv,
}

/// What one draft step produces.
#[derive(Debug, Clone)]
pub struct DraftStep {
    /// The greedy draft (argmax of `logits`, first index on ties).
    pub token: u32,
    /// `post_projection(norm(x))`, backbone width: the hidden input of the next step.
    pub hidden: Vec<f32>,
    /// Drafter logits over the vocabulary (no softcap). With the centroid head, the tokens
    /// outside the selected clusters hold `min(selected) − 1`, as transformers fills them.
    pub logits: Vec<f32>,
}

/// The MTP drafter: an assistant config and its weights.
pub struct Drafter {
    cfg: Config,
    w: Arc<ModelWeights>,
    /// Inverse rope frequencies, `[sliding, full]` (the drafter's rope parameters are the target's).
    inv_freq: [Vec<f32>; 2],
}

impl Drafter {
    /// A drafter from a `gemma4_assistant` config and its weights.
    pub fn new(cfg: Config, w: Arc<ModelWeights>) -> Result<Self> {
        if cfg.kind != ModelKind::Assistant || cfg.assistant.is_none() {
            return Err(Error::Invalid(
                "not a gemma4_assistant drafter: pass the assistant model as the draft model".into(),
            ));
        }
        if w.assistant.is_none() {
            return Err(Error::Invalid(
                "drafter weights lack pre_projection/post_projection (loaded with a non-assistant config?)".into(),
            ));
        }
        if cfg.layers.iter().any(|l| l.owns_kv()) {
            return Err(Error::Invalid(
                "drafter layers must all be KV-shared (num_kv_shared_layers = num_hidden_layers)".into(),
            ));
        }
        if let Some(a) = cfg.assistant.as_ref().filter(|a| a.use_ordered_embeddings) {
            if a.centroid_intermediate_top_k == 0 || a.centroid_intermediate_top_k > a.num_centroids {
                return Err(Error::Invalid(format!(
                    "drafter centroid_intermediate_top_k is {}: must be between 1 and num_centroids ({})",
                    a.centroid_intermediate_top_k, a.num_centroids
                )));
            }
        }
        let inv_freq = [cfg.text.rope_sliding.inv_freq(), cfg.text.rope_full.inv_freq()];
        Ok(Drafter { cfg, w, inv_freq })
    }

    /// A drafter from an opened model directory.
    pub fn from_model(m: &Model) -> Result<Self> {
        Self::new(m.cfg.clone(), m.weights.clone()).map_err(|e| Error::Invalid(format!("{}: {e}", m.source)))
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The drafter's weights (a device drafter packs them).
    pub fn weights(&self) -> &Arc<ModelWeights> {
        &self.w
    }

    /// The target hidden size this drafter expects.
    pub fn backbone_hidden(&self) -> usize {
        self.assistant_cfg().backbone_hidden_size
    }

    fn assistant_cfg(&self) -> &crate::config::AssistantConfig {
        self.cfg.assistant.as_ref().expect("checked in new")
    }

    fn aw(&self) -> &AssistantWeights {
        self.w.assistant.as_ref().expect("checked in new")
    }

    /// Checks that this drafter was made for `target`: hidden and vocabulary sizes, and head
    /// shapes that can attend to the target's producer layers.
    pub fn check_target(&self, target: &Config) -> Result<()> {
        let (t, d) = (&target.text, &self.cfg.text);
        let mut bad = Vec::new();
        if t.hidden_size != self.backbone_hidden() {
            bad.push(format!(
                "target hidden {} ≠ drafter backbone_hidden_size {}",
                t.hidden_size,
                self.backbone_hidden()
            ));
        }
        if t.vocab_size != d.vocab_size {
            bad.push(format!("target vocab {} ≠ drafter vocab {}", t.vocab_size, d.vocab_size));
        }
        for kind in [AttnKind::Sliding, AttnKind::Full] {
            let Some(p) = target.producer(kind) else {
                bad.push(format!("target has no cache-owning {kind:?} layer"));
                continue;
            };
            let pl = &target.layers[p];
            if let Some(l) = self.cfg.layers.iter().find(|l| l.kind == kind) {
                if l.head_dim != pl.head_dim || l.n_heads % pl.n_kv_heads != 0 {
                    bad.push(format!(
                        "{kind:?} layers: drafter {} heads × {}, target layer {p} {} kv heads × {}",
                        l.n_heads, l.head_dim, pl.n_kv_heads, pl.head_dim
                    ));
                }
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(format!("drafter does not fit this target: {}", bad.join("; "))))
        }
    }

    /// One draft step (Appendix B).
    pub fn step(&self, input: &StepInput) -> Result<DraftStep> {
        let (t, aw) = (&self.cfg.text, self.aw());
        let (hb, h, eps) = (self.backbone_hidden(), t.hidden_size, t.rms_norm_eps);
        if input.embedding.len() != hb || input.hidden.len() != hb {
            return Err(Error::Invalid(format!(
                "draft step: embedding ({}) and hidden ({}) must both have backbone_hidden_size {hb} values",
                input.embedding.len(),
                input.hidden.len()
            )));
        }

        // ---- x = W_pre [embedding, hidden]  (this order: spec §3.4)
        let cat: Vec<f32> = input.embedding.iter().chain(input.hidden).copied().collect();
        let mut x = reference::matmul(&aw.pre_projection, &cat, 1);

        for (l, lw) in self.cfg.layers.iter().zip(&self.w.layers) {
            let d = l.head_dim;
            let kv = input.kv.of(l.kind);
            if kv.head_dim != d || kv.n_kv_heads == 0 || l.n_heads % kv.n_kv_heads != 0 {
                return Err(Error::Invalid(format!(
                    "draft step: layer {} ({:?}) has {} heads × {d}, the target K/V has {} heads × {}",
                    l.index, l.kind, l.n_heads, kv.n_kv_heads, kv.head_dim
                )));
            }
            if kv.is_empty() {
                return Err(Error::Invalid(format!("draft step: no target K/V for the {:?} layers", l.kind)));
            }

            // ---- attention: q = rope(q_norm(W_q norm(x))) at position p over the target's K/V
            let mut xn = x.clone();
            reference::rmsnorm(&mut xn, Some(&lw.input_norm), eps);
            let mut q = reference::matmul(&lw.q_proj, &xn, 1);
            let inv = &self.inv_freq[(l.kind == AttnKind::Full) as usize];
            let (mut cos, mut sin) = (vec![0.0; d / 2], vec![0.0; d / 2]);
            reference::rope_table(inv, input.position, &mut cos, &mut sin);
            for head in q.chunks_mut(d) {
                reference::rmsnorm(head, Some(&lw.q_norm), eps);
                reference::rope(head, &cos, &sin);
            }
            let group = l.n_heads / kv.n_kv_heads;
            let mut att = vec![0.0f32; l.q_dim()];
            for (hh, (qh, out)) in q.chunks(d).zip(att.chunks_mut(d)).enumerate() {
                let kvh = hh / group;
                reference::attend(qh, 0..kv.len(), |r| kv.k_head(r, kvh), |r| kv.v_head(r, kvh), out);
            }
            let mut o = reference::matmul(&lw.o_proj, &att, 1);
            reference::rmsnorm(&mut o, Some(&lw.post_attn_norm), eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            // ---- feed-forward: x += norm(W_down (gelu(W_gate x_n) ⊙ W_up x_n)); then × layer_scalar
            let mut xn = x.clone();
            reference::rmsnorm(&mut xn, Some(&lw.pre_ff_norm), eps);
            let g = reference::matmul(&lw.gate_proj, &xn, 1);
            let u = reference::matmul(&lw.up_proj, &xn, 1);
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| reference::gelu_tanh(g) * u).collect();
            let mut m = reference::matmul(&lw.down_proj, &a, 1);
            reference::rmsnorm(&mut m, Some(&lw.post_ff_norm), eps);
            x.iter_mut().zip(&m).for_each(|(a, b)| *a += b);
            x.iter_mut().for_each(|v| *v *= lw.layer_scalar);
        }
        reference::rmsnorm(&mut x, Some(&self.w.final_norm), eps);
        debug_assert_eq!(x.len(), h);

        let hidden = reference::matmul(&aw.post_projection, &x, 1);
        // No final softcap: transformers' drafter head has none, whatever text_config says.
        let logits = match (&aw.centroids, &aw.token_ordering) {
            (Some(c), Some(order)) => self.centroid_logits(c, order, &x),
            _ => reference::matmul(&self.w.embed, &x, 1),
        };
        let token = argmax(&logits);
        Ok(DraftStep { token, hidden, logits })
    }

    /// The "ordered embeddings" head (spec §3.3): the top-k centroids of `x` pick clusters of
    /// `vocab / num_centroids` token ids from `token_ordering`; only those tokens are scored
    /// against the tied embedding, the rest get `min(scored) − 1`.
    fn centroid_logits(&self, centroids: &Matrix, order: &[u32], x: &[f32]) -> Vec<f32> {
        let a = self.assistant_cfg();
        let vocab = self.cfg.text.vocab_size;
        let per = vocab / a.num_centroids;
        let scores = reference::matmul(centroids, x, 1);
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        // Stable sort, descending: ties keep the lower centroid first. Which of two tied
        // centroids wins cannot change the argmax unless a token sits in both, and clusters are
        // disjoint.
        idx.sort_by(|&i, &j| scores[j].total_cmp(&scores[i]));
        let mut row = vec![0.0f32; x.len()];
        let mut picked: Vec<(usize, f32)> = Vec::with_capacity(a.centroid_intermediate_top_k * per);
        for &c in idx.iter().take(a.centroid_intermediate_top_k) {
            for &tok in &order[c * per..(c + 1) * per] {
                self.w.embed.row_f32(tok as usize, &mut row);
                let s: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                picked.push((tok as usize, s as f32));
            }
        }
        let fill = picked.iter().map(|p| p.1).fold(f32::INFINITY, f32::min) - 1.0;
        let mut logits = vec![fill; vocab];
        for (tok, s) in picked {
            logits[tok] = s;
        }
        logits
    }

    /// A block of `k` greedy drafts at position `p`, the first fed `token` with `hidden`
    /// (spec §3.4): step j > 0 feeds draft j − 1 and the previous step's projected hidden,
    /// at the same position over the same target K/V.
    pub fn draft_block(
        &self,
        ctx: &dyn DraftContext,
        token: u32,
        hidden: &[f32],
        p: usize,
        k: usize,
    ) -> Result<Vec<DraftStep>> {
        if ctx.hidden_size() != self.backbone_hidden() {
            return Err(Error::Invalid(format!(
                "drafter expects a target of hidden size {}, this target has {}",
                self.backbone_hidden(),
                ctx.hidden_size()
            )));
        }
        let kv = DraftKv::gather(ctx, p, self.cfg.text.sliding_window)?;
        let mut steps: Vec<DraftStep> = Vec::with_capacity(k);
        let mut tok = token;
        for _ in 0..k {
            let embedding = ctx.token_embedding(tok)?;
            let h = steps.last().map_or(hidden, |s| &s.hidden[..]);
            let s = self.step(&StepInput { embedding: &embedding, hidden: h, position: p, kv: &kv })?;
            tok = s.token;
            steps.push(s);
        }
        Ok(steps)
    }

    /// The first block after the target's last step emitted `token`: position = the target's
    /// cached length, hidden = the last row of the target's last step.
    pub fn draft_after_step(&self, ctx: &dyn DraftContext, token: u32, k: usize) -> Result<Vec<DraftStep>> {
        let rows = ctx.last_hidden()?;
        let h = ctx.hidden_size();
        if rows.len() < h {
            return Err(Error::Invalid("drafting needs a target step first (no hidden state yet)".into()));
        }
        self.draft_block(ctx, token, &rows[rows.len() - h..], ctx.cached_len(), k)
    }
}
