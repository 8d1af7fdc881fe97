//! The CPU reference backend: the Gemma 4 forward pass in plain f32 Rust, llama2.c style.
//!
//! It is the oracle for the GPU backends (and usable as `--backend cpu` where no GPU exists), so
//! it is written to read like spec §2, not to be fast. Its KV cache keeps every position (no
//! ring buffer): the sliding window is a mask here, which is what lets the tests catch a wrong
//! ring layout in a GPU backend.

use std::ops::Range;
use std::sync::Arc;

use crate::backend::{Backend, MemoryUse, Readback, StepOutput};
use crate::config::{AttnKind, Config, KvSource};
use crate::error::{Error, Result};
use crate::loader::{ExpertFiles, ExpertGateUp, Matrix, ModelWeights};
use crate::reference::{self, argmax, embed_scale};
use crate::spec::{DraftContext, KvRows};
use crate::streamer::{ExpertSlots, StreamStats, Streamer, SKIP};

/// The f32 reference backend.
pub struct CpuBackend {
    cfg: Config,
    w: Arc<ModelWeights>,
    max_ctx: usize,
    /// Per KV-owning layer: K and V, `[position][n_kv_heads * head_dim]`, flattened.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    inv_freq: [Vec<f32>; 2],
    /// Installed experts: slot memory per MoE layer, and the streamer (absent when every expert
    /// is resident).
    experts: Option<HostExperts>,
    /// Post-final-norm hidden states of the last step, `[rows][hidden]`: the MTP drafter's
    /// input (spec §3.4), kept so that drafting needs no second forward.
    last_hidden: Vec<f32>,
    /// K/V rows of the last `verify`, per cache, until `commit`.
    staged: Vec<(Vec<f32>, Vec<f32>)>,
    staged_rows: usize,
}

/// An installation's experts in host memory: `n_slots` blobs per layer.
struct HostExperts {
    files: Arc<ExpertFiles>,
    streamer: Option<Streamer>,
    mem: std::collections::BTreeMap<usize, Vec<u8>>,
}

impl CpuBackend {
    pub fn new(cfg: Config, w: Arc<ModelWeights>, max_ctx: usize) -> Self {
        Self::with_experts(cfg, w, max_ctx, ExpertSlots::All).expect("stacked experts need no I/O")
    }

    /// With an installation's experts: `slots` per layer (or all of them, read once now).
    pub fn with_experts(cfg: Config, w: Arc<ModelWeights>, max_ctx: usize, slots: ExpertSlots) -> Result<Self> {
        let n_caches = cfg.kv_owning_layers().count();
        let inv_freq = [cfg.text.rope_sliding.inv_freq(), cfg.text.rope_full.inv_freq()];
        let experts = match &w.expert_files {
            None => None,
            Some(files) => {
                let l = &files.layout;
                let (n, streamer) = match slots {
                    ExpertSlots::Some(s) => (s.min(l.n_experts), Some(Streamer::new(files.clone(), s))),
                    ExpertSlots::All => (l.n_experts, None),
                };
                let mut mem = std::collections::BTreeMap::new();
                for &layer in l.layers.keys() {
                    let mut m = vec![0u8; n * l.blob_stride as usize];
                    if streamer.is_none() {
                        files.for_each_expert(layer, |e, blob| {
                            m[e as usize * l.blob_stride as usize..][..blob.len()].copy_from_slice(blob);
                            Ok(())
                        })?;
                    }
                    mem.insert(layer, m);
                }
                Some(HostExperts { files: files.clone(), streamer, mem })
            }
        };
        Ok(CpuBackend {
            cfg,
            w,
            max_ctx,
            k_cache: vec![Vec::new(); n_caches],
            v_cache: vec![Vec::new(); n_caches],
            inv_freq,
            experts,
            last_hidden: Vec::new(),
            staged: Vec::new(),
            staged_rows: 0,
        })
    }

    fn cache_of(&self, layer: usize) -> usize {
        match self.cfg.layers[layer].kv {
            KvSource::Own { cache } => cache,
            KvSource::Shared { producer } => match self.cfg.layers[producer].kv {
                KvSource::Own { cache } => cache,
                KvSource::Shared { .. } => unreachable!("config derives producers from owning layers"),
            },
        }
    }

    /// Hidden states after the final norm for `tokens` at `pos..`, one row per token.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        let cfg = self.cfg.clone();
        let w = self.w.clone();
        let t = &cfg.text;
        let (n, h, eps) = (tokens.len(), t.hidden_size, t.rms_norm_eps);

        // ---- embeddings: h = E[id] * √H
        let scale = embed_scale(h);
        let mut x = vec![0.0f32; n * h];
        for (i, &id) in tokens.iter().enumerate() {
            let row = &mut x[i * h..(i + 1) * h];
            w.embed.row_f32(id as usize, row);
            row.iter_mut().for_each(|v| *v *= scale);
        }

        // ---- per-layer inputs: ple = (norm(W_plmp · h · H^-½) + E_ple[id] · √P) · 2^-½
        let ple = w.ple.as_ref().map(|p| {
            let pd = t.hidden_size_per_layer_input;
            let lp = t.num_hidden_layers * pd;
            let mut ctx = reference::matmul(&p.model_projection, &x, n);
            let s = (h as f64).powf(-0.5) as f32;
            ctx.iter_mut().for_each(|v| *v *= s);
            reference::rmsnorm_rows(&mut ctx, pd, Some(&p.projection_norm), eps);
            let tok_scale = (pd as f64).sqrt() as f32;
            let mut tok = vec![0.0f32; lp];
            for (i, &id) in tokens.iter().enumerate() {
                p.embed.row_f32(id as usize, &mut tok);
                for j in 0..lp {
                    let c = &mut ctx[i * lp + j];
                    *c = (*c + tok[j] * tok_scale) * std::f32::consts::FRAC_1_SQRT_2;
                }
            }
            ctx
        });

        for (li, (l, lw)) in cfg.layers.iter().zip(&w.layers).enumerate() {
            let d = l.head_dim;
            let inv = &self.inv_freq[(l.kind == AttnKind::Full) as usize];
            let (mut cos, mut sin) = (vec![0.0; d / 2], vec![0.0; d / 2]);

            // ---- attention: x_n = norm(h); q = rope(q_norm(W_q x_n)); k, v likewise into the cache
            let mut xn = x.clone();
            reference::rmsnorm_rows(&mut xn, h, Some(&lw.input_norm), eps);
            let mut q = reference::matmul(&lw.q_proj, &xn, n);
            for i in 0..n {
                reference::rope_table(inv, pos + i, &mut cos, &mut sin);
                for head in q[i * l.q_dim()..(i + 1) * l.q_dim()].chunks_mut(d) {
                    reference::rmsnorm(head, Some(&lw.q_norm), eps);
                    reference::rope(head, &cos, &sin);
                }
            }
            let c = self.cache_of(li);
            if let KvSource::Own { .. } = l.kv {
                let kp = lw.k_proj.as_ref().expect("loader provides k_proj on KV-owning layers");
                let mut k = reference::matmul(kp, &xn, n);
                let mut v = match &lw.v_proj {
                    Some(vp) => reference::matmul(vp, &xn, n),
                    None => k.clone(), // attention_k_eq_v: V is the raw K projection
                };
                let kn = lw.k_norm.as_ref().expect("loader provides k_norm on KV-owning layers");
                for i in 0..n {
                    reference::rope_table(inv, pos + i, &mut cos, &mut sin);
                    for head in k[i * l.kv_dim()..(i + 1) * l.kv_dim()].chunks_mut(d) {
                        reference::rmsnorm(head, Some(kn), eps);
                        reference::rope(head, &cos, &sin);
                    }
                }
                reference::rmsnorm_rows(&mut v, d, None, eps);
                let kv_dim = l.kv_dim();
                for cache in [&mut self.k_cache[c], &mut self.v_cache[c]] {
                    cache.resize((pos + n) * kv_dim, 0.0);
                }
                self.k_cache[c][pos * kv_dim..].copy_from_slice(&k);
                self.v_cache[c][pos * kv_dim..].copy_from_slice(&v);
            }
            let (kc, vc) = (&self.k_cache[c], &self.v_cache[c]);
            let kv_dim = l.kv_dim();
            let group = l.n_heads / l.n_kv_heads;
            let mut att = vec![0.0f32; n * l.q_dim()];
            for i in 0..n {
                let p = pos + i;
                let lo = match l.kind {
                    AttnKind::Sliding => (p + 1).saturating_sub(t.sliding_window),
                    AttnKind::Full => 0,
                };
                for hh in 0..l.n_heads {
                    let kvh = hh / group;
                    let qh = &q[i * l.q_dim() + hh * d..i * l.q_dim() + (hh + 1) * d];
                    let out = &mut att[i * l.q_dim() + hh * d..i * l.q_dim() + (hh + 1) * d];
                    reference::attend(
                        qh,
                        lo..p + 1,
                        |pp| &kc[pp * kv_dim + kvh * d..pp * kv_dim + (kvh + 1) * d],
                        |pp| &vc[pp * kv_dim + kvh * d..pp * kv_dim + (kvh + 1) * d],
                        out,
                    );
                }
            }
            let mut o = reference::matmul(&lw.o_proj, &att, n);
            reference::rmsnorm_rows(&mut o, h, Some(&lw.post_attn_norm), eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            // ---- feed-forward: m = W_down (gelu(W_gate x_n) ⊙ W_up x_n), x_n = norm(h)
            let mut xn = x.clone();
            reference::rmsnorm_rows(&mut xn, h, Some(&lw.pre_ff_norm), eps);
            let mut m = geglu(&lw.gate_proj, &lw.up_proj, &lw.down_proj, &xn, n);
            if let Some(moe) = &lw.moe {
                // MoE layers: m = norm_1(dense m) + norm_2(Σ_experts), router on the residual h.
                reference::rmsnorm_rows(&mut m, h, Some(&moe.post_norm_1), eps);
                let mut routed = moe_forward(&cfg, moe, li, &x, n, self.experts.as_mut())?;
                reference::rmsnorm_rows(&mut routed, h, Some(&moe.post_norm_2), eps);
                m.iter_mut().zip(&routed).for_each(|(a, b)| *a += b);
            }
            reference::rmsnorm_rows(&mut m, h, Some(&lw.post_ff_norm), eps);
            x.iter_mut().zip(&m).for_each(|(a, b)| *a += b);

            // ---- per-layer input: h += norm(W_proj (gelu(W_gate h) ⊙ ple[layer]))
            if let (Some(lp), Some(ple)) = (&lw.ple, &ple) {
                let pd = t.hidden_size_per_layer_input;
                let lpw = t.num_hidden_layers * pd;
                let mut g = reference::matmul(&lp.input_gate, &x, n);
                for i in 0..n {
                    for j in 0..pd {
                        let gv = &mut g[i * pd + j];
                        *gv = reference::gelu_tanh(*gv) * ple[i * lpw + li * pd + j];
                    }
                }
                let mut y = reference::matmul(&lp.projection, &g, n);
                reference::rmsnorm_rows(&mut y, h, Some(&lp.post_norm), eps);
                x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            }
            x.iter_mut().for_each(|v| *v *= lw.layer_scalar);
        }
        reference::rmsnorm_rows(&mut x, h, Some(&w.final_norm), eps);
        if let Some(s) = self.experts.as_mut().and_then(|e| e.streamer.as_mut()) {
            s.count_tokens(n);
        }
        Ok(x)
    }

    /// Positions held in the KV cache (`0..cached_len()`).
    pub fn cached_len(&self) -> usize {
        self.cfg.kv_owning_layers().next().map_or(0, |l| self.k_cache[self.cache_of(l.index)].len() / l.kv_dim())
    }

    /// K and V of `layer` (its producer's cache for a KV-shared layer) at `positions`, as cached:
    /// K post-k_norm post-RoPE, V post-v_norm.
    pub fn kv_rows(&self, layer: usize, positions: Range<usize>) -> Result<KvRows> {
        let l = self.cfg.layers.get(layer).ok_or_else(|| {
            Error::Invalid(format!("layer {layer} out of range (the model has {})", self.cfg.layers.len()))
        })?;
        let (c, kv_dim) = (self.cache_of(layer), l.kv_dim());
        let held = self.k_cache[c].len() / kv_dim;
        if positions.start > positions.end || positions.end > held {
            return Err(Error::Invalid(format!(
                "K/V of positions {positions:?} requested from layer {layer}, the cache holds 0..{held}"
            )));
        }
        let span = positions.start * kv_dim..positions.end * kv_dim;
        Ok(KvRows {
            start: positions.start,
            k: self.k_cache[c][span.clone()].to_vec(),
            v: self.v_cache[c][span].to_vec(),
            n_kv_heads: l.n_kv_heads,
            head_dim: l.head_dim,
        })
    }

    /// Post-final-norm hidden states of the last `prefill`/`decode` step, `[rows][hidden]`
    /// (empty before the first step and after `reset`).
    pub fn last_hidden(&self) -> &[f32] {
        &self.last_hidden
    }

    /// The scaled input embedding of `token`: `E[token] · √H`, as the forward pass starts.
    pub fn token_embedding(&self, token: u32) -> Result<Vec<f32>> {
        self.w.scaled_embedding(&self.cfg, token)
    }

    /// Expert streaming figures, when the experts stream through a slot cache.
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.experts.as_ref().and_then(|e| e.streamer.as_ref()).map(|s| s.stats())
    }

    fn head(&self, hidden: &[f32], rows: usize) -> Vec<f32> {
        let mut logits = reference::matmul(&self.w.embed, hidden, rows);
        if let Some(cap) = self.cfg.text.final_logit_softcapping {
            reference::softcap(&mut logits, cap);
        }
        logits
    }
}

/// `W_down (gelu(W_gate x) ⊙ W_up x)` for `n` rows of `x`.
fn geglu(gate: &Matrix, up: &Matrix, down: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let g = reference::matmul(gate, x, n);
    let u = reference::matmul(up, x, n);
    let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| reference::gelu_tanh(g) * u).collect();
    reference::matmul(down, &a, n)
}

/// Routed experts of one MoE layer (spec §2.2): router on `norm(h) · scale · H^-½`, softmax in
/// f64, top-k, renormalise, `× per_expert_scale`; experts see `pre_norm_2(h)`. The experts come
/// from the checkpoint's stacked tensors, or from an installation's blobs (all resident, or
/// streamed through the slot cache in as many rounds as the step needs).
fn moe_forward(
    cfg: &Config,
    moe: &crate::loader::MoeWeights,
    layer: usize,
    x: &[f32],
    n: usize,
    host: Option<&mut HostExperts>,
) -> Result<Vec<f32>> {
    let t = &cfg.text;
    let (h, eps, e, k, iw) = (t.hidden_size, t.rms_norm_eps, t.num_experts, t.top_k_experts, t.moe_intermediate_size);
    let mut rin = x.to_vec();
    reference::rmsnorm_rows(&mut rin, h, None, eps);
    let s = (h as f64).powf(-0.5) as f32;
    for row in rin.chunks_mut(h) {
        row.iter_mut().zip(&moe.router_scale).for_each(|(v, w)| *v = *v * w * s);
    }
    let scores = reference::matmul(&moe.router_proj, &rin, n);
    let mut xe = x.to_vec();
    reference::rmsnorm_rows(&mut xe, h, Some(&moe.pre_norm_2), eps);

    // Routing: pairs[i * k + j] = expert, weights in the same order (descending probability).
    let mut pairs = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    for i in 0..n {
        let sc = &scores[i * e..(i + 1) * e];
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let p: Vec<f64> = sc.iter().map(|&v| (v as f64 - m).exp()).collect();
        let mut idx: Vec<usize> = (0..e).collect();
        // Stable sort: ties keep the lower expert index first, as torch.topk does in practice.
        idx.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap_or(std::cmp::Ordering::Equal));
        let top = &idx[..k];
        let z: f64 = top.iter().map(|&j| p[j]).sum();
        for &ex in top {
            pairs.push(ex as u32);
            weights.push((p[ex] / z) as f32 * moe.per_expert_scale[ex]);
        }
    }

    // One expert on one token: W_down (gelu(W_gate x) ⊙ W_up x), rows fetched by `row(part, r)`.
    let expert =
        |xi: &[f32], gate_up: &dyn Fn(usize, bool, &mut [f32]), down: &dyn Fn(usize, &mut [f32])| -> Vec<f32> {
            let mut row = vec![0.0f32; h];
            let mut col = vec![0.0f32; iw];
            let (mut g, mut u) = (vec![0.0f32; iw], vec![0.0f32; iw]);
            for r in 0..iw {
                gate_up(r, false, &mut row);
                g[r] = row.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
                gate_up(r, true, &mut row);
                u[r] = row.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
            }
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| reference::gelu_tanh(g) * u).collect();
            (0..h)
                .map(|r| {
                    down(r, &mut col);
                    col.iter().zip(&a).map(|(&c, &v)| c as f64 * v as f64).sum::<f64>() as f32
                })
                .collect()
        };

    let mut ys: Vec<Vec<f32>> = vec![Vec::new(); n * k];
    match (&moe.experts, host) {
        (Some(st), _) => {
            for (pi, &ex) in pairs.iter().enumerate() {
                let ex = ex as usize;
                let xi = &xe[(pi / k) * h..(pi / k + 1) * h];
                let gu = |r: usize, up: bool, out: &mut [f32]| match &st.gate_up {
                    ExpertGateUp::Fused(m) => m.row_f32(ex * 2 * iw + if up { iw } else { 0 } + r, out),
                    ExpertGateUp::Split { gate, up: u } => (if up { u } else { gate }).row_f32(ex * iw + r, out),
                };
                ys[pi] = expert(xi, &gu, &|r, out| st.down.row_f32(ex * h + r, out));
            }
        }
        (None, Some(host)) => {
            let layout = host.files.layout.clone();
            let stride = layout.blob_stride as usize;
            let rounds = match &host.streamer {
                Some(s) => s.rounds(layer, &pairs),
                None => vec![Vec::new()],
            };
            for round in rounds {
                let mem = host
                    .mem
                    .get_mut(&layer)
                    .ok_or_else(|| Error::Invalid(format!("layer {layer} has no expert file")))?;
                let slots = match &mut host.streamer {
                    Some(s) => s.load(layer, &round, &pairs, &mut |slot, blob| {
                        mem[slot as usize * stride..][..blob.len()].copy_from_slice(blob);
                        Ok(())
                    })?,
                    None => pairs.clone(),
                };
                let gate_up = layout.part("gate_up");
                let (gate, up, down) =
                    (layout.part("gate"), layout.part("up"), layout.part("down").expect("checked layout"));
                for (pi, &slot) in slots.iter().enumerate() {
                    if slot == SKIP {
                        continue;
                    }
                    let blob = &mem[slot as usize * stride..(slot as usize + 1) * stride];
                    let xi = &xe[(pi / k) * h..(pi / k + 1) * h];
                    let gu = |r: usize, is_up: bool, out: &mut [f32]| match gate_up {
                        Some(p) => p.row_f32(blob, if is_up { iw } else { 0 } + r, out),
                        None => (if is_up { up } else { gate }).expect("checked layout").row_f32(blob, r, out),
                    };
                    ys[pi] = expert(xi, &gu, &|r, out| down.row_f32(blob, r, out));
                }
            }
        }
        (None, None) => {
            return Err(Error::Invalid(
                "MoE layer without expert weights (an installation opened without its expert files)".into(),
            ))
        }
    }
    let mut out = vec![0.0f32; n * h];
    for (pi, y) in ys.iter().enumerate() {
        let o = &mut out[(pi / k) * h..(pi / k + 1) * h];
        o.iter_mut().zip(y).for_each(|(a, &b)| *a += weights[pi] * b);
    }
    Ok(out)
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }
    fn device_info(&self) -> String {
        "CPU (f32 reference)".into()
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn max_chunk(&self) -> usize {
        128
    }
    fn max_context(&self) -> usize {
        self.max_ctx
    }
    fn prefill(&mut self, tokens: &[u32], pos: usize, readback: Readback) -> Result<StepOutput> {
        if tokens.is_empty() {
            return Err(Error::Invalid("prefill of zero tokens".into()));
        }
        if pos + tokens.len() > self.max_ctx {
            return Err(Error::Invalid(format!(
                "position {} is past the context of {}",
                pos + tokens.len(),
                self.max_ctx
            )));
        }
        let vocab = self.cfg.text.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let hidden = self.forward(tokens, pos)?;
        if readback == Readback::Nothing {
            self.last_hidden = hidden;
            return Ok(StepOutput::default());
        }
        let h = self.cfg.text.hidden_size;
        let n = tokens.len();
        let (rows, hid) = match readback {
            Readback::AllLogits => (n, &hidden[..]),
            _ => (1, &hidden[(n - 1) * h..]),
        };
        let logits = self.head(hid, rows);
        let argmax = logits.chunks(vocab).map(argmax).collect();
        self.last_hidden = hidden;
        Ok(StepOutput { argmax, logits: if readback == Readback::Argmax { Vec::new() } else { logits } })
    }
    fn reset(&mut self) {
        self.k_cache.iter_mut().for_each(Vec::clear);
        self.v_cache.iter_mut().for_each(Vec::clear);
        self.last_hidden.clear();
    }
    fn memory(&self) -> MemoryUse {
        let state: usize = self.k_cache.iter().chain(&self.v_cache).map(|c| c.len() * 4).sum();
        let experts: usize = self.experts.as_ref().map_or(0, |e| e.mem.values().map(Vec::len).sum());
        MemoryUse { weight_bytes: experts as u64, state_bytes: state as u64 }
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        CpuBackend::stream_stats(self)
    }
    fn verify(&mut self, tokens: &[u32], pos: usize, with_logits: bool) -> Result<StepOutput> {
        let before: Vec<usize> = self.k_cache.iter().map(Vec::len).collect();
        let out = self.prefill(tokens, pos, Readback::AllLogits);
        // Move the step's K/V rows out of the cache into staging, success or not: the forward
        // appended them (attention inside the block needs them), the cache must not keep them.
        self.staged.clear();
        for (c, &b) in before.iter().enumerate() {
            let k = self.k_cache[c].split_off(b);
            let v = self.v_cache[c].split_off(b);
            self.staged.push((k, v));
        }
        self.staged_rows = tokens.len();
        let mut out = out?;
        if !with_logits {
            out.logits.clear();
        }
        Ok(out)
    }
    fn max_verify(&self) -> usize {
        self.max_chunk()
    }
    fn commit(&mut self, n: usize) -> Result<()> {
        if n > self.staged_rows {
            return Err(Error::Invalid(format!("commit of {n} rows, the last verify staged {}", self.staged_rows)));
        }
        for (c, (k, v)) in self.staged.iter().enumerate() {
            let row = k.len() / self.staged_rows.max(1);
            self.k_cache[c].extend_from_slice(&k[..n * row]);
            self.v_cache[c].extend_from_slice(&v[..n * row]);
        }
        self.staged.clear();
        self.staged_rows = 0;
        Ok(())
    }
    fn draft_context(&self) -> Option<&dyn crate::spec::DraftContext> {
        Some(self)
    }
}

impl DraftContext for CpuBackend {
    fn hidden_size(&self) -> usize {
        self.cfg.text.hidden_size
    }
    fn cached_len(&self) -> usize {
        CpuBackend::cached_len(self)
    }
    fn token_embedding(&self, token: u32) -> Result<Vec<f32>> {
        CpuBackend::token_embedding(self, token)
    }
    fn producer_kv(&self, kind: AttnKind, positions: Range<usize>) -> Result<KvRows> {
        let layer = self.cfg.producer(kind).ok_or_else(|| {
            Error::Invalid(format!("the target has no cache-owning {kind:?} layer for the drafter to read"))
        })?;
        self.kv_rows(layer, positions)
    }
    fn last_hidden(&self) -> Result<Vec<f32>> {
        Ok(self.last_hidden.clone())
    }
}
