//! Checkpoint → typed, shape-checked weights ([`ModelWeights`]), without copying tensors.
//!
//! Names: HF multimodal checkpoints prefix text weights with `model.language_model.`, bare text
//! checkpoints with `model.`, MLX conversions with `language_model.model.`; drafters keep HF's
//! top-level names. Vision/audio towers and the unused K/V projections of KV-shared layers are
//! never looked up, so they cost nothing. Every tensor is checked against the shape the config
//! implies, and a mismatch names the tensor, the file, what was expected and what was found.
//!
//! Matrices stay in the mapping; only vectors (norm weights, scalars) are converted to f32 here.

pub mod installed;
pub mod safetensors;

use std::path::Path;

use crate::config::{Config, ModelKind};
use crate::error::{Error, Result};
use crate::quant::{self, DType, QuantLayout};
pub use installed::ExpertFiles;
pub use safetensors::{FileBytes, SafetensorsFile, TensorRef, TensorStore};

/// A 2-D weight matrix `[rows, cols]` (HF `nn.Linear` layout: `y = x · Wᵀ`, one row per output).
// The variants differ by two tensor handles; a model holds a few hundred matrices, so boxing the
// larger one would only add an indirection to every read.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Matrix {
    /// bf16, f16 or f32 values, row-major.
    Float { t: TensorRef, rows: usize, cols: usize },
    /// MLX affine: packed u32 words `[rows, cols*bits/32]`, bf16 scales and biases `[rows, cols/group]`.
    Quant { w: TensorRef, scales: TensorRef, biases: TensorRef, layout: QuantLayout },
}

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Float { rows, .. } => *rows,
            Matrix::Quant { layout, .. } => layout.rows,
        }
    }
    pub fn cols(&self) -> usize {
        match self {
            Matrix::Float { cols, .. } => *cols,
            Matrix::Quant { layout, .. } => layout.cols,
        }
    }
    pub fn name(&self) -> &str {
        match self {
            Matrix::Float { t, .. } => &t.name,
            Matrix::Quant { w, .. } => &w.name,
        }
    }
    /// Bytes a full pass over the matrix reads (weights, scales and biases).
    pub fn nbytes(&self) -> usize {
        match self {
            Matrix::Float { t, .. } => t.bytes().len(),
            Matrix::Quant { w, scales, biases, .. } => w.bytes().len() + scales.bytes().len() + biases.bytes().len(),
        }
    }
    /// A short format tag: `bf16`, `f16`, `f32`, `q4`, `q8`.
    pub fn format(&self) -> &'static str {
        match self {
            Matrix::Float { t, .. } => match t.dtype() {
                DType::BF16 => "bf16",
                DType::F16 => "f16",
                _ => "f32",
            },
            Matrix::Quant { layout, .. } => {
                if layout.bits == 4 {
                    "q4"
                } else {
                    "q8"
                }
            }
        }
    }
    /// Row `r` as f32 (dequantised exactly as the kernels do).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Matrix::Float { t, cols, .. } => {
                let b = t.bytes();
                let d = t.dtype();
                for (c, o) in out.iter_mut().enumerate().take(*cols) {
                    *o = quant::read_float(b, d, r * cols + c);
                }
            }
            Matrix::Quant { w, scales, biases, layout } => {
                quant::dequant_row(layout, w.bytes(), scales.bytes(), biases.bytes(), r, out)
            }
        }
    }
}

impl crate::reference::MatrixRows for Matrix {
    fn rows(&self) -> usize {
        Matrix::rows(self)
    }
    fn cols(&self) -> usize {
        Matrix::cols(self)
    }
    fn name(&self) -> &str {
        Matrix::name(self)
    }
    fn row_f32(&self, r: usize, out: &mut [f32]) {
        Matrix::row_f32(self, r, out)
    }
}

/// Per-layer-embedding (PLE) weights of E2B/E4B.
pub struct PleWeights {
    /// `embed_tokens_per_layer`: `[vocab, n_layers * ple_dim]`.
    pub embed: Matrix,
    /// `per_layer_model_projection`: `[n_layers * ple_dim, hidden]`.
    pub model_projection: Matrix,
    /// `per_layer_projection_norm`: `[ple_dim]`, shared by all layers.
    pub projection_norm: Vec<f32>,
}

/// A layer's PLE injection weights.
pub struct LayerPle {
    pub input_gate: Matrix,  // [ple_dim, hidden]
    pub projection: Matrix,  // [hidden, ple_dim]
    pub post_norm: Vec<f32>, // [hidden]
}

/// Expert weights of a MoE layer. Gate and up are separate matrices (MLX form) or one fused
/// `gate_up_proj` (HF form: rows `[e*2I, e*2I+I)` gate, `[e*2I+I, (e+1)*2I)` up).
#[allow(clippy::large_enum_variant)] // one per MoE layer: see `Matrix`
pub enum ExpertGateUp {
    Fused(Matrix),
    Split { gate: Matrix, up: Matrix },
}

/// Routed expert weights held in the checkpoint's own stacked tensors.
pub struct StackedExperts {
    pub gate_up: ExpertGateUp, // experts stacked along rows
    pub down: Matrix,          // [n_experts * hidden, expert_width]
}

/// The MoE block of a 26B-A4B layer (routed experts plus the norms around them).
pub struct MoeWeights {
    pub router_proj: Matrix,        // [n_experts, hidden]
    pub router_scale: Vec<f32>,     // [hidden]
    pub per_expert_scale: Vec<f32>, // [n_experts]
    /// `None` in an installation: the experts live in per-layer files and stream through the
    /// expert cache (`crate::streamer`).
    pub experts: Option<StackedExperts>,
    pub pre_norm_2: Vec<f32>,
    pub post_norm_1: Vec<f32>,
    pub post_norm_2: Vec<f32>,
}

/// One decoder layer.
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub pre_ff_norm: Vec<f32>,
    pub post_ff_norm: Vec<f32>,
    pub layer_scalar: f32,
    pub q_proj: Matrix,
    pub q_norm: Vec<f32>,
    /// K/V projections and k_norm: only on layers that own a KV cache. `v_proj` is absent on
    /// `attention_k_eq_v` full layers (V is the K projection).
    pub k_proj: Option<Matrix>,
    pub v_proj: Option<Matrix>,
    pub k_norm: Option<Vec<f32>>,
    pub o_proj: Matrix,
    pub gate_proj: Matrix,
    pub up_proj: Matrix,
    pub down_proj: Matrix,
    pub ple: Option<LayerPle>,
    pub moe: Option<MoeWeights>,
}

/// Drafter-only weights (gemma4_assistant).
pub struct AssistantWeights {
    pub pre_projection: Matrix,  // [hidden, 2 * backbone_hidden]
    pub post_projection: Matrix, // [backbone_hidden, hidden]
    pub centroids: Option<Matrix>,
    pub token_ordering: Option<Vec<u32>>,
}

/// All weights of a model, checked against its config.
pub struct ModelWeights {
    /// `embed_tokens`: `[vocab, hidden]`; also the tied LM head.
    pub embed: Matrix,
    pub ple: Option<PleWeights>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub assistant: Option<AssistantWeights>,
    /// The routed experts of an installation (`MoeWeights::experts` is then `None`).
    pub expert_files: Option<std::sync::Arc<ExpertFiles>>,
}

// ---------------------------------------------------------------------------------------------

/// Resolves names and checks shapes for one checkpoint.
struct Resolver<'a> {
    store: &'a TensorStore,
    cfg: &'a Config,
    prefix: String,
}

impl Resolver<'_> {
    fn tried(&self, name: &str) -> String {
        format!("`{}{}`", self.prefix, name)
    }
    fn get(&self, name: &str) -> Result<TensorRef> {
        self.store
            .get(&format!("{}{}", self.prefix, name))
            .ok_or_else(|| Error::MissingTensor { name: name.to_string(), tried: self.tried(name) })
    }
    fn has(&self, name: &str) -> bool {
        self.store.contains(&format!("{}{}", self.prefix, name))
    }
    fn shape_err(&self, t: &TensorRef, expected: Vec<usize>) -> Error {
        Error::Shape { file: t.path().to_path_buf(), name: t.name.clone(), expected, found: t.shape().to_vec() }
    }
    fn expect_float(&self, t: &TensorRef) -> Result<()> {
        match t.dtype() {
            DType::BF16 | DType::F16 | DType::F32 => Ok(()),
            _ => Err(Error::DType {
                file: t.path().to_path_buf(),
                name: t.name.clone(),
                expected: "BF16, F16 or F32".into(),
                found: t.dtype_name(),
            }),
        }
    }

    /// A vector of `n` floats (norm weights), as f32.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        self.expect_float(&t)?;
        if t.shape() != [n] {
            return Err(self.shape_err(&t, vec![n]));
        }
        Ok(quant::floats_to_f32(t.bytes(), t.dtype()))
    }

    /// A scalar stored as `[1]` (layer_scalar).
    fn scalar(&self, name: &str) -> Result<f32> {
        Ok(self.vector(name, 1)?[0])
    }

    /// A matrix `module` of logical shape `lead ++ [out, in]` (`lead` is `[n_experts]` for expert
    /// stacks, empty otherwise). Quantised if `module.scales` exists. HF expert stacks have no
    /// `.weight` suffix, so `module` may be the full tensor name (`weight_suffix = false`).
    fn matrix_nd(&self, module: &str, lead: &[usize], out: usize, inp: usize, weight_suffix: bool) -> Result<Matrix> {
        let mut logical: Vec<usize> = lead.to_vec();
        logical.extend([out, inp]);
        let stack: usize = lead.iter().product();
        if self.has(&format!("{module}.scales")) {
            let w = self.get(&format!("{module}.weight"))?;
            let scales = self.get(&format!("{module}.scales"))?;
            let biases = self.get(&format!("{module}.biases"))?;
            let q = self.cfg.quant.as_ref().ok_or_else(|| {
                Error::config(
                    w.path(),
                    format!("tensor `{}` is quantised but config.json has no `quantization` block", w.name),
                )
            })?;
            let (gs, cfg_bits) = q.for_module(&format!("{}{}", self.prefix, module));
            // Bits follow from the packed width; the config decides only when it names the module.
            let wshape = w.shape();
            let bits = if wshape.len() == logical.len() && inp > 0 { (wshape[wshape.len() - 1] * 32) / inp } else { 0 };
            let bits = bits as u32;
            let named = q.overrides.contains_key(&format!("{}{}", self.prefix, module));
            let bits_ok = (bits == 4 || bits == 8) && (!named || bits == cfg_bits) && inp.is_multiple_of(gs);
            let mut exp_w = lead.to_vec();
            exp_w.extend([out, inp * cfg_bits as usize / 32]);
            if !bits_ok
                || wshape[..wshape.len() - 1] != exp_w[..exp_w.len() - 1]
                || (wshape[wshape.len() - 1] * 32) % inp != 0
            {
                return Err(self.shape_err(&w, exp_w));
            }
            if w.dtype() != DType::U32 {
                return Err(Error::DType {
                    file: w.path().into(),
                    name: w.name.clone(),
                    expected: "U32".into(),
                    found: w.dtype_name(),
                });
            }
            let mut exp_s = lead.to_vec();
            exp_s.extend([out, inp / gs]);
            for t in [&scales, &biases] {
                if t.dtype() != DType::BF16 {
                    return Err(Error::DType {
                        file: t.path().into(),
                        name: t.name.clone(),
                        expected: "BF16".into(),
                        found: t.dtype_name(),
                    });
                }
                if t.shape() != exp_s.as_slice() {
                    return Err(self.shape_err(t, exp_s.clone()));
                }
            }
            Ok(Matrix::Quant {
                w,
                scales,
                biases,
                layout: QuantLayout { rows: stack * out, cols: inp, bits, group_size: gs },
            })
        } else {
            let name = if weight_suffix { format!("{module}.weight") } else { module.to_string() };
            let t = self.get(&name)?;
            self.expect_float(&t)?;
            if t.shape() != logical.as_slice() {
                return Err(self.shape_err(&t, logical));
            }
            Ok(Matrix::Float { t, rows: stack * out, cols: inp })
        }
    }

    fn matrix(&self, module: &str, out: usize, inp: usize) -> Result<Matrix> {
        self.matrix_nd(module, &[], out, inp, true)
    }
}

/// Chooses the name prefix by looking for the embedding table under each known convention.
fn detect_prefix(store: &TensorStore, kind: ModelKind) -> Result<String> {
    let candidates: &[&str] = match kind {
        ModelKind::Target => &["model.language_model.", "language_model.model.", "model.", ""],
        ModelKind::Assistant => &["model.", "language_model.model.", ""],
    };
    for p in candidates {
        if store.contains(&format!("{p}embed_tokens.weight")) {
            return Ok(p.to_string());
        }
    }
    Err(Error::MissingTensor {
        name: "embed_tokens.weight".into(),
        tried: candidates.iter().map(|p| format!("`{p}embed_tokens.weight`")).collect::<Vec<_>>().join(", "),
    })
}

impl ModelWeights {
    /// The scaled input embedding of `token`, `E[token] · f32(√H)`, as the forward pass starts
    /// (and as the MTP drafter reads it).
    pub fn scaled_embedding(&self, cfg: &Config, token: u32) -> Result<Vec<f32>> {
        let (vocab, h) = (cfg.text.vocab_size, cfg.text.hidden_size);
        if token as usize >= vocab {
            return Err(Error::Invalid(format!("token id {token} is outside the vocabulary (size {vocab})")));
        }
        let mut row = vec![0.0f32; h];
        self.embed.row_f32(token as usize, &mut row);
        let scale = crate::reference::embed_scale(h);
        row.iter_mut().for_each(|v| *v *= scale);
        Ok(row)
    }

    /// Resolves and checks every tensor the config implies.
    pub fn load(store: &TensorStore, cfg: &Config) -> Result<Self> {
        Self::load_with(store, cfg, true)
    }

    /// Like [`load`](Self::load); with `stacked_experts = false` the routed expert tensors are
    /// not looked up (an installation keeps them in per-layer files).
    pub fn load_with(store: &TensorStore, cfg: &Config, stacked_experts: bool) -> Result<Self> {
        let prefix = detect_prefix(store, cfg.kind)?;
        let r = Resolver { store, cfg, prefix };
        let t = &cfg.text;
        let h = t.hidden_size;
        let embed = r.matrix("embed_tokens", t.vocab_size, h)?;
        let ple = if cfg.has_ple() {
            let p = t.hidden_size_per_layer_input;
            let lp = t.num_hidden_layers * p;
            Some(PleWeights {
                embed: r.matrix("embed_tokens_per_layer", t.vocab_size_per_layer_input, lp)?,
                model_projection: r.matrix("per_layer_model_projection", lp, h)?,
                projection_norm: r.vector("per_layer_projection_norm.weight", p)?,
            })
        } else {
            None
        };
        let final_norm = r.vector("norm.weight", h)?;
        let mut layers = Vec::with_capacity(cfg.layers.len());
        for l in &cfg.layers {
            let p = format!("layers.{}.", l.index);
            let owns = l.owns_kv();
            let (k_proj, v_proj, k_norm) = if owns {
                let k = r.matrix(&format!("{p}self_attn.k_proj"), l.kv_dim(), h)?;
                let v = if l.k_eq_v { None } else { Some(r.matrix(&format!("{p}self_attn.v_proj"), l.kv_dim(), h)?) };
                let kn = r.vector(&format!("{p}self_attn.k_norm.weight"), l.head_dim)?;
                (Some(k), v, Some(kn))
            } else {
                (None, None, None)
            };
            let layer_ple = if cfg.has_ple() {
                let pd = t.hidden_size_per_layer_input;
                Some(LayerPle {
                    input_gate: r.matrix(&format!("{p}per_layer_input_gate"), pd, h)?,
                    projection: r.matrix(&format!("{p}per_layer_projection"), h, pd)?,
                    post_norm: r.vector(&format!("{p}post_per_layer_input_norm.weight"), h)?,
                })
            } else {
                None
            };
            let moe = if t.enable_moe_block { Some(load_moe(&r, &p, cfg, stacked_experts)?) } else { None };
            layers.push(LayerWeights {
                input_norm: r.vector(&format!("{p}input_layernorm.weight"), h)?,
                post_attn_norm: r.vector(&format!("{p}post_attention_layernorm.weight"), h)?,
                pre_ff_norm: r.vector(&format!("{p}pre_feedforward_layernorm.weight"), h)?,
                post_ff_norm: r.vector(&format!("{p}post_feedforward_layernorm.weight"), h)?,
                layer_scalar: r.scalar(&format!("{p}layer_scalar"))?,
                q_proj: r.matrix(&format!("{p}self_attn.q_proj"), l.q_dim(), h)?,
                q_norm: r.vector(&format!("{p}self_attn.q_norm.weight"), l.head_dim)?,
                k_proj,
                v_proj,
                k_norm,
                o_proj: r.matrix(&format!("{p}self_attn.o_proj"), h, l.q_dim())?,
                gate_proj: r.matrix(&format!("{p}mlp.gate_proj"), l.mlp_width, h)?,
                up_proj: r.matrix(&format!("{p}mlp.up_proj"), l.mlp_width, h)?,
                down_proj: r.matrix(&format!("{p}mlp.down_proj"), h, l.mlp_width)?,
                ple: layer_ple,
                moe,
            });
        }
        let assistant = match &cfg.assistant {
            None => None,
            Some(a) => {
                let top = Resolver { store, cfg, prefix: String::new() };
                let centroids = if a.use_ordered_embeddings {
                    Some(top.matrix("masked_embedding.centroids", a.num_centroids, h)?)
                } else {
                    None
                };
                let token_ordering = if a.use_ordered_embeddings {
                    let o = top.get("masked_embedding.token_ordering")?;
                    if o.shape() != [t.vocab_size] {
                        return Err(top.shape_err(&o, vec![t.vocab_size]));
                    }
                    if o.dtype() != DType::I64 {
                        return Err(Error::DType {
                            file: o.path().into(),
                            name: o.name.clone(),
                            expected: "I64".into(),
                            found: o.dtype_name(),
                        });
                    }
                    let ids: Vec<u32> = o
                        .bytes()
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().expect("chunks_exact(8) yields 8 bytes")) as u32)
                        .collect();
                    if let Some(bad) = ids.iter().find(|&&i| i as usize >= t.vocab_size) {
                        return Err(Error::Invalid(format!(
                            "{}: token_ordering holds id {bad} ≥ vocab_size {}",
                            o.path().display(),
                            t.vocab_size
                        )));
                    }
                    Some(ids)
                } else {
                    None
                };
                Some(AssistantWeights {
                    pre_projection: top.matrix("pre_projection", h, 2 * a.backbone_hidden_size)?,
                    post_projection: top.matrix("post_projection", a.backbone_hidden_size, h)?,
                    centroids,
                    token_ordering,
                })
            }
        };
        Ok(ModelWeights { embed, ple, final_norm, layers, assistant, expert_files: None })
    }
}

fn load_moe(r: &Resolver, p: &str, cfg: &Config, stacked: bool) -> Result<MoeWeights> {
    let t = &cfg.text;
    let (h, e) = (t.hidden_size, t.num_experts);
    Ok(MoeWeights {
        router_proj: r.matrix(&format!("{p}router.proj"), e, h)?,
        router_scale: r.vector(&format!("{p}router.scale"), h)?,
        per_expert_scale: r.vector(&format!("{p}router.per_expert_scale"), e)?,
        experts: if stacked { Some(load_stacked_experts(r, p, cfg)?) } else { None },
        pre_norm_2: r.vector(&format!("{p}pre_feedforward_layernorm_2.weight"), h)?,
        post_norm_1: r.vector(&format!("{p}post_feedforward_layernorm_1.weight"), h)?,
        post_norm_2: r.vector(&format!("{p}post_feedforward_layernorm_2.weight"), h)?,
    })
}

fn load_stacked_experts(r: &Resolver, p: &str, cfg: &Config) -> Result<StackedExperts> {
    let t = &cfg.text;
    let (h, e, i) = (t.hidden_size, t.num_experts, t.moe_intermediate_size);
    let gate_up = if r.has(&format!("{p}experts.switch_glu.gate_proj.weight")) {
        ExpertGateUp::Split {
            gate: r.matrix_nd(&format!("{p}experts.switch_glu.gate_proj"), &[e], i, h, true)?,
            up: r.matrix_nd(&format!("{p}experts.switch_glu.up_proj"), &[e], i, h, true)?,
        }
    } else {
        ExpertGateUp::Fused(r.matrix_nd(&format!("{p}experts.gate_up_proj"), &[e], 2 * i, h, false)?)
    };
    let down = if r.has(&format!("{p}experts.switch_glu.down_proj.weight")) {
        r.matrix_nd(&format!("{p}experts.switch_glu.down_proj"), &[e], h, i, true)?
    } else {
        r.matrix_nd(&format!("{p}experts.down_proj"), &[e], h, i, false)?
    };
    Ok(StackedExperts { gate_up, down })
}

/// Stop ids: `generation_config.json`'s `eos_token_id` (else config.json's), plus 50
/// (`<|tool_response>`), which Gemma 4 emits to hand control back after a tool call.
pub fn stop_ids(dir: Option<&Path>, gen_config_json: Option<&str>, cfg: &Config) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::new();
    let text = match (gen_config_json, dir) {
        (Some(s), _) => Some(s.to_string()),
        (None, Some(d)) => std::fs::read_to_string(d.join("generation_config.json")).ok(),
        _ => None,
    };
    if let Some(v) = text.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok()) {
        match v.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => ids.extend(n.as_u64().map(|x| x as u32)),
            Some(serde_json::Value::Array(a)) => ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32)),
            _ => {}
        }
    }
    if ids.is_empty() {
        ids = cfg.eos_token_ids.clone();
    }
    if cfg.text.vocab_size > 50 && !ids.contains(&50) {
        ids.push(50);
    }
    ids
}
