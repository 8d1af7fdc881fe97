//! The CPU reference backend: the Gemma 4 forward pass in plain f32 Rust, llama2.c style.
//!
//! It is the oracle for the GPU backends (and usable as `--backend cpu` where no GPU exists), so
//! it is written to read like spec §2, not to be fast. Its KV cache keeps every position (no
//! ring buffer): the sliding window is a mask here, which is what lets the tests catch a wrong
//! ring layout in a GPU backend.

pub mod ops;

use std::sync::Arc;

use crate::backend::{Backend, MemoryUse, Readback, StepOutput};
use crate::config::{AttnKind, Config, KvSource};
use crate::error::{Error, Result};
use crate::loader::{ExpertGateUp, Matrix, ModelWeights};
use crate::sampler::argmax;

/// Scale applied to the token embedding: `sqrt(hidden)` rounded to the activation dtype, as
/// transformers does (`embed_scale.to(dtype)`). Kestrel computes in f32, so this is `f32(√H)`;
/// a bf16 run of transformers would use `bf16(√H)` (39.25 for E2B).
pub fn embed_scale(hidden: usize) -> f32 {
    (hidden as f64).sqrt() as f32
}

/// The f32 reference backend.
pub struct CpuBackend {
    cfg: Config,
    w: Arc<ModelWeights>,
    max_ctx: usize,
    /// Per KV-owning layer: K and V, `[position][n_kv_heads * head_dim]`, flattened.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    inv_freq: [Vec<f32>; 2],
}

impl CpuBackend {
    pub fn new(cfg: Config, w: Arc<ModelWeights>, max_ctx: usize) -> Self {
        let n_caches = cfg.kv_owning_layers().count();
        let inv_freq = [cfg.text.rope_sliding.inv_freq(), cfg.text.rope_full.inv_freq()];
        CpuBackend { cfg, w, max_ctx, k_cache: vec![Vec::new(); n_caches], v_cache: vec![Vec::new(); n_caches], inv_freq }
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
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Vec<f32> {
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
            let mut ctx = ops::matmul(&p.model_projection, &x, n);
            let s = (h as f64).powf(-0.5) as f32;
            ctx.iter_mut().for_each(|v| *v *= s);
            ops::rmsnorm_rows(&mut ctx, pd, Some(&p.projection_norm), eps);
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
            ops::rmsnorm_rows(&mut xn, h, Some(&lw.input_norm), eps);
            let mut q = ops::matmul(&lw.q_proj, &xn, n);
            for i in 0..n {
                ops::rope_table(inv, pos + i, &mut cos, &mut sin);
                for head in q[i * l.q_dim()..(i + 1) * l.q_dim()].chunks_mut(d) {
                    ops::rmsnorm(head, Some(&lw.q_norm), eps);
                    ops::rope(head, &cos, &sin);
                }
            }
            let c = self.cache_of(li);
            if let KvSource::Own { .. } = l.kv {
                let kp = lw.k_proj.as_ref().expect("loader provides k_proj on KV-owning layers");
                let mut k = ops::matmul(kp, &xn, n);
                let mut v = match &lw.v_proj {
                    Some(vp) => ops::matmul(vp, &xn, n),
                    None => k.clone(), // attention_k_eq_v: V is the raw K projection
                };
                let kn = lw.k_norm.as_ref().expect("loader provides k_norm on KV-owning layers");
                for i in 0..n {
                    ops::rope_table(inv, pos + i, &mut cos, &mut sin);
                    for head in k[i * l.kv_dim()..(i + 1) * l.kv_dim()].chunks_mut(d) {
                        ops::rmsnorm(head, Some(kn), eps);
                        ops::rope(head, &cos, &sin);
                    }
                }
                ops::rmsnorm_rows(&mut v, d, None, eps);
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
                    ops::attend(
                        qh,
                        lo..p + 1,
                        |pp| &kc[pp * kv_dim + kvh * d..pp * kv_dim + (kvh + 1) * d],
                        |pp| &vc[pp * kv_dim + kvh * d..pp * kv_dim + (kvh + 1) * d],
                        out,
                    );
                }
            }
            let mut o = ops::matmul(&lw.o_proj, &att, n);
            ops::rmsnorm_rows(&mut o, h, Some(&lw.post_attn_norm), eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            // ---- feed-forward: m = W_down (gelu(W_gate x_n) ⊙ W_up x_n), x_n = norm(h)
            let mut xn = x.clone();
            ops::rmsnorm_rows(&mut xn, h, Some(&lw.pre_ff_norm), eps);
            let mut m = geglu(&lw.gate_proj, &lw.up_proj, &lw.down_proj, &xn, n);
            if let Some(moe) = &lw.moe {
                // MoE layers: m = norm_1(dense m) + norm_2(Σ_experts), router on the residual h.
                ops::rmsnorm_rows(&mut m, h, Some(&moe.post_norm_1), eps);
                let mut routed = moe_forward(&cfg, moe, &x, n);
                ops::rmsnorm_rows(&mut routed, h, Some(&moe.post_norm_2), eps);
                m.iter_mut().zip(&routed).for_each(|(a, b)| *a += b);
            }
            ops::rmsnorm_rows(&mut m, h, Some(&lw.post_ff_norm), eps);
            x.iter_mut().zip(&m).for_each(|(a, b)| *a += b);

            // ---- per-layer input: h += norm(W_proj (gelu(W_gate h) ⊙ ple[layer]))
            if let (Some(lp), Some(ple)) = (&lw.ple, &ple) {
                let pd = t.hidden_size_per_layer_input;
                let lpw = t.num_hidden_layers * pd;
                let mut g = ops::matmul(&lp.input_gate, &x, n);
                for i in 0..n {
                    for j in 0..pd {
                        let gv = &mut g[i * pd + j];
                        *gv = ops::gelu_tanh(*gv) * ple[i * lpw + li * pd + j];
                    }
                }
                let mut y = ops::matmul(&lp.projection, &g, n);
                ops::rmsnorm_rows(&mut y, h, Some(&lp.post_norm), eps);
                x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            }
            x.iter_mut().for_each(|v| *v *= lw.layer_scalar);
        }
        ops::rmsnorm_rows(&mut x, h, Some(&w.final_norm), eps);
        x
    }

    fn head(&self, hidden: &[f32], rows: usize) -> Vec<f32> {
        let mut logits = ops::matmul(&self.w.embed, hidden, rows);
        if let Some(cap) = self.cfg.text.final_logit_softcapping {
            ops::softcap(&mut logits, cap);
        }
        logits
    }
}

/// `W_down (gelu(W_gate x) ⊙ W_up x)` for `n` rows of `x`.
fn geglu(gate: &Matrix, up: &Matrix, down: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let g = ops::matmul(gate, x, n);
    let u = ops::matmul(up, x, n);
    let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| ops::gelu_tanh(g) * u).collect();
    ops::matmul(down, &a, n)
}

/// Routed experts of one MoE layer (spec §2.2): router on `norm(h) · scale · H^-½`, softmax in
/// f64, top-k, renormalise, `× per_expert_scale`; experts see `pre_norm_2(h)`.
fn moe_forward(cfg: &Config, moe: &crate::loader::MoeWeights, x: &[f32], n: usize) -> Vec<f32> {
    let t = &cfg.text;
    let (h, eps, e, k, iw) = (t.hidden_size, t.rms_norm_eps, t.num_experts, t.top_k_experts, t.moe_intermediate_size);
    let mut rin = x.to_vec();
    ops::rmsnorm_rows(&mut rin, h, None, eps);
    let s = (h as f64).powf(-0.5) as f32;
    for row in rin.chunks_mut(h) {
        row.iter_mut().zip(&moe.router_scale).for_each(|(v, w)| *v = *v * w * s);
    }
    let scores = ops::matmul(&moe.router_proj, &rin, n);
    let mut xe = x.to_vec();
    ops::rmsnorm_rows(&mut xe, h, Some(&moe.pre_norm_2), eps);
    let mut out = vec![0.0f32; n * h];
    let mut row = vec![0.0f32; h];
    let mut col = vec![0.0f32; iw];
    for i in 0..n {
        let sc = &scores[i * e..(i + 1) * e];
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let p: Vec<f64> = sc.iter().map(|&v| (v as f64 - m).exp()).collect();
        let mut idx: Vec<usize> = (0..e).collect();
        // Stable sort: ties keep the lower expert index first, as torch.topk does in practice.
        idx.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap_or(std::cmp::Ordering::Equal));
        let top = &idx[..k];
        let z: f64 = top.iter().map(|&j| p[j]).sum();
        let xi = &xe[i * h..(i + 1) * h];
        for &ex in top {
            let wgt = (p[ex] / z) as f32 * moe.per_expert_scale[ex];
            let (mut g, mut u) = (vec![0.0f32; iw], vec![0.0f32; iw]);
            for r in 0..iw {
                let (gm, gr, um, ur) = match &moe.gate_up {
                    ExpertGateUp::Fused(m) => (m, ex * 2 * iw + r, m, ex * 2 * iw + iw + r),
                    ExpertGateUp::Split { gate, up } => (gate, ex * iw + r, up, ex * iw + r),
                };
                gm.row_f32(gr, &mut row);
                g[r] = row.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
                um.row_f32(ur, &mut row);
                u[r] = row.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
            }
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| ops::gelu_tanh(g) * u).collect();
            for r in 0..h {
                moe.down.row_f32(ex * h + r, &mut col);
                let y = col.iter().zip(&a).map(|(&c, &v)| c as f64 * v as f64).sum::<f64>() as f32;
                out[i * h + r] += wgt * y;
            }
        }
    }
    out
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
            return Err(Error::Invalid(format!("position {} is past the context of {}", pos + tokens.len(), self.max_ctx)));
        }
        let vocab = self.cfg.text.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let hidden = self.forward(tokens, pos);
        let h = self.cfg.text.hidden_size;
        let n = tokens.len();
        let (rows, hid) = match readback {
            Readback::AllLogits => (n, &hidden[..]),
            _ => (1, &hidden[(n - 1) * h..]),
        };
        let logits = self.head(hid, rows);
        let argmax = logits.chunks(vocab).map(argmax).collect();
        Ok(StepOutput { argmax, logits: if readback == Readback::Argmax { Vec::new() } else { logits } })
    }
    fn reset(&mut self) {
        self.k_cache.iter_mut().for_each(Vec::clear);
        self.v_cache.iter_mut().for_each(Vec::clear);
    }
    fn memory(&self) -> MemoryUse {
        let state: usize = self.k_cache.iter().chain(&self.v_cache).map(|c| c.len() * 4).sum();
        MemoryUse { weight_bytes: 0, state_bytes: state as u64 }
    }
}
