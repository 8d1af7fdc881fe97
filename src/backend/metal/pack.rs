//! The Metal kernels' view of a model: weights packed into arena buffers and a program table of
//! offsets, written once at load.
//!
//! Metal binds at most 31 buffers per kernel (wgpu-hal takes some), and a model has hundreds of
//! matrices, so the kernels address every weight through one table instead of one binding each:
//! a header (`H_*`, `A_*`), one record per layer (`L_*`) and one descriptor per matrix (`D_*`).
//! The constants below mirror the enums at the top of `msl/decode.metal`; a test parses that file
//! and compares, so the two cannot drift apart silently.
//!
//! Matrices keep their checkpoint bytes (bf16/f16/f32 rows, or MLX affine words with bf16 scales
//! and biases): the kernels dequantise exactly as `crate::quant::dequant_row`. Norm vectors are
//! stored as f32. Offsets count 4-byte words, so one arena reaches 16 GiB.

use crate::config::{AttnKind, Config};
use crate::error::{Error, Result};
use crate::kv::KvLayout;
use crate::loader::installed::{ExpertLayout, PartLayout};
use crate::loader::{ExpertGateUp, Matrix, ModelWeights};
use crate::quant::DType;

// Header words.
pub const H_HIDDEN: usize = 0;
pub const H_VOCAB: usize = 1;
pub const H_LAYERS: usize = 2;
pub const H_EPS: usize = 3;
pub const H_SOFTCAP: usize = 4;
pub const H_PLE_DIM: usize = 5;
pub const H_EMBED: usize = 6;
pub const H_EMBED_SCALE: usize = 7;
pub const H_PLE_EMBED: usize = 8;
pub const H_PLE_PROJ: usize = 9;
pub const H_PLE_NORM: usize = 10;
pub const H_FINAL_NORM: usize = 11;
pub const H_LAYER_BASE: usize = 12;
pub const H_DESC_BASE: usize = 13;
pub const H_ROPE_S: usize = 14;
pub const H_ROPE_F: usize = 15;
pub const H_INV_SQRT_H: usize = 16;
pub const H_SQRT_PLE: usize = 17;
pub const H_OUT_LOGITS: usize = 18;
pub const H_OUT_HIDDEN: usize = 19;
// Activation offsets (in floats of the `act` buffer), also header words.
pub const A_Q: usize = 20;
pub const A_K: usize = 21;
pub const A_V: usize = 22;
pub const A_ATT: usize = 23;
pub const A_O: usize = 24;
pub const A_GU: usize = 25;
pub const A_M: usize = 26;
pub const A_PLE: usize = 27;
pub const A_PG: usize = 28;
pub const A_PY: usize = 29;
pub const A_BEST: usize = 30;
pub const A_SCORES: usize = 31;
pub const A_EGU: usize = 32;
pub const A_ED: usize = 33;
pub const A_XG: usize = 34;
pub const H_STEP_MAP: usize = 35;
// Per-token strides of the activation regions whose width varies by layer or model.
pub const H_S_Q: usize = 36;
pub const H_S_KV: usize = 37;
pub const H_S_GU: usize = 38;
pub const H_ROPE_STRIDE: usize = 39;
pub const H_S_SCORES: usize = 40;
pub const H_S_EGU: usize = 41;
pub const H_S_ED: usize = 42;
/// Table offset of the drafter's header (draft.metal's DH_* words); 0 without a drafter.
pub const H_DRAFT: usize = 43;
pub const H_WORDS: usize = 48;

// The drafter's header (msl/draft.metal).
pub const DH_HIDDEN: usize = 0;
pub const DH_BACKBONE: usize = 1;
pub const DH_LAYERS: usize = 2;
pub const DH_EPS: usize = 3;
pub const DH_WINDOW: usize = 4;
pub const DH_PRE: usize = 5;
pub const DH_POST: usize = 6;
pub const DH_EMBED: usize = 7;
pub const DH_FINAL_NORM: usize = 8;
pub const DH_CENTROIDS: usize = 9;
pub const DH_ORDER: usize = 10;
pub const DH_N_CENTROIDS: usize = 11;
pub const DH_TOPK_C: usize = 12;
pub const DH_LAYER_BASE: usize = 13;
pub const DH_TARGET_EMBED: usize = 14;
pub const DH_EMBED_SCALE: usize = 15;
pub const DH_STEP_HIDDEN: usize = 16;
pub const DA_X: usize = 17;
pub const DA_XG: usize = 18;
pub const DA_Q: usize = 19;
pub const DA_ATT: usize = 20;
pub const DA_O: usize = 21;
pub const DA_GU: usize = 22;
pub const DA_M: usize = 23;
pub const DA_H: usize = 24;
pub const DA_SCORES: usize = 25;
pub const DA_BEST: usize = 26;
pub const DA_TOK: usize = 27;
pub const DH_WORDS: usize = 32;
/// Most centroids the drafter's masked head keeps (`csel` in draft.metal).
pub const MAX_TOPK_C: usize = 64;

// Layer record words.
pub const L_KIND: usize = 0;
pub const L_HEAD_DIM: usize = 1;
pub const L_HEADS: usize = 2;
pub const L_KV_HEADS: usize = 3;
pub const L_K_OFF: usize = 4;
pub const L_V_OFF: usize = 5;
pub const L_SLOTS: usize = 6;
pub const L_WRITES_KV: usize = 7;
pub const L_K_EQ_V: usize = 8;
pub const L_MLP: usize = 9;
pub const L_IN_NORM: usize = 10;
pub const L_Q_NORM: usize = 11;
pub const L_K_NORM: usize = 12;
pub const L_POST_ATTN: usize = 13;
pub const L_PRE_FF: usize = 14;
pub const L_POST_FF: usize = 15;
pub const L_SCALAR: usize = 16;
pub const L_Q: usize = 17;
pub const L_K: usize = 18;
pub const L_V: usize = 19;
pub const L_O: usize = 20;
pub const L_GATE: usize = 21;
pub const L_UP: usize = 22;
pub const L_DOWN: usize = 23;
pub const L_PLE_GATE: usize = 24;
pub const L_PLE_PROJ: usize = 25;
pub const L_PLE_POST: usize = 26;
pub const L_WINDOW: usize = 27;
pub const L_MOE: usize = 28;
pub const L_ROUTER: usize = 29;
pub const L_ROUTER_SCALE: usize = 30;
pub const L_EXPERT_SCALE: usize = 31;
pub const L_PRE_NORM_2: usize = 32;
pub const L_POST_NORM_1: usize = 33;
pub const L_POST_NORM_2: usize = 34;
pub const L_E_GATE: usize = 35;
pub const L_E_UP: usize = 36;
pub const L_E_DOWN: usize = 37;
pub const L_E_GATE_STRIDE: usize = 38;
pub const L_E_UP_BASE: usize = 39;
pub const L_E_WIDTH: usize = 40;
pub const L_TOPK: usize = 41;
pub const L_EXPERTS: usize = 42;
pub const L_E_DOWN_STRIDE: usize = 43;
pub const L_E_SLOT_WORDS: usize = 44;
pub const L_E_SLOT_MAP: usize = 45;
pub const L_WORDS: usize = 48;

// Matrix descriptor words.
pub const D_FMT: usize = 0;
pub const D_ROWS: usize = 1;
pub const D_COLS: usize = 2;
pub const D_W: usize = 3;
pub const D_S: usize = 4;
pub const D_B: usize = 5;
pub const D_GROUP: usize = 6;
pub const D_ARENA: usize = 7;
pub const D_WORDS: usize = 8;

// Matrix formats (D_FMT).
pub const FMT_F32: u32 = 32;
pub const FMT_BF16: u32 = 16;
pub const FMT_F16: u32 = 17;
pub const FMT_Q4: u32 = 4;
pub const FMT_Q8: u32 = 8;

/// Most routed experts per token and most experts a router ranks (`route` in decode.metal).
pub const MAX_TOPK: usize = 16;
pub const MAX_EXPERTS: usize = 256;

/// "No such weight" in a table word.
pub const NONE: u32 = u32::MAX;

/// Most tokens one launch runs (decode 1; a verify or a prefill piece up to this many).
pub const MAX_M: usize = 8;

/// Layout of the per-step `step` buffer (words): token count, first position, resume, stop, the
/// token ids, then each token's rope tables, then the slot map of streamed experts.
pub const STEP_COUNT: usize = 0;
pub const STEP_POS: usize = 1;
pub const STEP_RESUME: usize = 2;
pub const STEP_STOP: usize = 3;
pub const STEP_TOKENS: usize = 4;
pub const STEP_ROPE: usize = STEP_TOKENS + MAX_M;
/// `out` buffer: words 0..MAX_M the argmax of each token, logits from here on (then the hidden
/// states).
pub const OUT_LOGITS: usize = MAX_M;

/// Everything the kernels need that does not change per step.
pub struct Packed {
    pub table: Vec<u32>,
    /// Arena A: dense weights and norm vectors.
    pub arena: Vec<u32>,
    /// Arena B: the routed experts (empty without MoE layers).
    pub arena_b: Vec<u32>,
    /// Floats of the `act` buffer.
    pub act_len: usize,
    /// Floats of the `kv` buffer.
    pub kv_len: usize,
    /// Words of the `step` buffer.
    pub step_len: usize,
    /// Words of the `out` buffer.
    pub out_len: usize,
    /// Half head_dim of the sliding and the full rope (their cos/sin tables are this long).
    pub rope_half: [usize; 2],
    /// Float offsets of each cache's K and V in the `kv` buffer, in `KvLayout::caches` order.
    pub cache_offsets: Vec<(usize, usize)>,
    /// Installed experts: each MoE layer's slot region in arena B (byte offset).
    pub expert_regions: std::collections::BTreeMap<usize, usize>,
}

/// An installation's experts as the kernels see them: `slots` blobs per MoE layer in arena B;
/// `streamed` when the host fills them per step (a slot map), else slot = expert.
pub struct InstalledExperts<'a> {
    pub layout: &'a ExpertLayout,
    pub slots: usize,
    pub streamed: bool,
}

impl Packed {
    /// Word offset of the post-final-norm hidden states in `out` (token t at + t · hidden).
    pub fn out_hidden(&self) -> usize {
        self.table[H_OUT_HIDDEN] as usize
    }
}

struct Builder {
    /// Arenas A and B.
    arenas: [Vec<u32>; 2],
    descs: Vec<u32>,
}

impl Builder {
    fn bytes(&mut self, arena: usize, b: &[u8]) -> Result<u32> {
        let a = &mut self.arenas[arena];
        let off = a.len();
        let mut words = vec![0u32; b.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..b.len()].copy_from_slice(b);
        a.extend_from_slice(&words);
        u32::try_from(off).map_err(|_| {
            Error::Invalid("the weights pass 16 GiB in one arena: more arenas are needed for this model".into())
        })
    }

    fn vec(&mut self, v: &[f32]) -> u32 {
        let a = &mut self.arenas[0];
        let off = a.len();
        a.extend(v.iter().map(|x| x.to_bits()));
        off as u32
    }

    /// Reserves `bytes` of zeros in `arena`; returns the byte offset.
    fn zeros(&mut self, arena: usize, bytes: usize) -> Result<usize> {
        let at = self.bytes(arena, &[])? as usize * 4;
        self.arenas[arena].resize(self.arenas[arena].len() + bytes.div_ceil(4), 0);
        Ok(at)
    }

    /// The descriptor of expert part `p` of the blob at byte `region` (slot 0; the kernels add
    /// a slot's offset).
    fn blob_part(&mut self, region: usize, p: &PartLayout) -> Result<u32> {
        let word = |off: u64| -> Result<u32> {
            let at = region as u64 + off;
            if !at.is_multiple_of(4) {
                return Err(Error::Invalid(format!("expert part `{}` is not word-aligned in its blob", p.role)));
            }
            u32::try_from(at / 4).map_err(|_| Error::Invalid("the experts pass 16 GiB in arena B".into()))
        };
        let (fmt, s, b, group) = match p.bits() {
            Some(bits) => {
                let (s, b) = p.scales.zip(p.biases).ok_or_else(|| {
                    Error::Invalid(format!("quantised expert part `{}` lacks scales or biases", p.role))
                })?;
                (bits, word(s.0)?, word(b.0)?, p.group_size as u32)
            }
            None => {
                let fmt = match p.dtype() {
                    DType::F32 => FMT_F32,
                    DType::F16 => FMT_F16,
                    _ => FMT_BF16,
                };
                (fmt, 0, 0, 0)
            }
        };
        let d = [fmt, p.rows as u32, p.cols as u32, word(p.w.0)?, s, b, group, 1];
        let idx = self.descs.len() / D_WORDS;
        self.descs.extend_from_slice(&d);
        Ok(idx as u32)
    }

    /// Appends `m` to arena A and its descriptor; returns the descriptor index.
    fn matrix(&mut self, m: &Matrix) -> Result<u32> {
        self.matrix_in(0, m)
    }

    /// Appends `m` to arena `arena` and its descriptor; returns the descriptor index.
    fn matrix_in(&mut self, arena: usize, m: &Matrix) -> Result<u32> {
        let (rows, cols) = (m.rows(), m.cols());
        let d = match m {
            Matrix::Float { t, .. } => {
                let fmt = match t.dtype() {
                    DType::F32 => FMT_F32,
                    DType::BF16 => FMT_BF16,
                    DType::F16 => FMT_F16,
                    other => {
                        return Err(Error::Invalid(format!(
                            "matrix {} is {}, which the Metal kernels do not read",
                            m.name(),
                            other.name()
                        )))
                    }
                };
                if fmt != FMT_F32 && cols % 2 != 0 {
                    return Err(Error::Invalid(format!(
                        "matrix {} has an odd column count {cols}: the Metal kernels read 16-bit rows in word pairs",
                        m.name()
                    )));
                }
                let w = self.bytes(arena, t.bytes())?;
                [fmt, rows as u32, cols as u32, w, 0, 0, 0, arena as u32]
            }
            Matrix::Quant { w, scales, biases, layout } => {
                if layout.bits != 4 && layout.bits != 8 {
                    return Err(Error::Invalid(format!(
                        "matrix {} is {}-bit: the Metal kernels read 4- and 8-bit MLX weights",
                        m.name(),
                        layout.bits
                    )));
                }
                if layout.group_size % layout.values_per_word() != 0 || cols % layout.group_size != 0 {
                    return Err(Error::Invalid(format!(
                        "matrix {}: group size {} does not tile its {cols} columns in whole words",
                        m.name(),
                        layout.group_size
                    )));
                }
                let wo = self.bytes(arena, w.bytes())?;
                let so = self.bytes(arena, scales.bytes())?;
                let bo = self.bytes(arena, biases.bytes())?;
                [layout.bits, rows as u32, cols as u32, wo, so, bo, layout.group_size as u32, arena as u32]
            }
        };
        let idx = self.descs.len() / D_WORDS;
        self.descs.extend_from_slice(&d);
        Ok(idx as u32)
    }
}

/// The drafter's header and layer records (its matrices go to `b`, its activations after
/// `act_len`, its step input at `step_at`); the caller places them in the table.
#[allow(clippy::too_many_arguments)]
fn pack_drafter(
    b: &mut Builder,
    target: &Config,
    head: &[u32],
    kv: &KvLayout,
    cache_off: &[(usize, usize)],
    dc: &Config,
    dw: &ModelWeights,
    groups: usize,
    warps: usize,
    act_len: &mut usize,
    step_at: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let (a, aw) = match (&dc.assistant, &dw.assistant) {
        (Some(a), Some(aw)) => (a, aw),
        _ => return Err(Error::Invalid("the drafter is not a gemma4_assistant model".into())),
    };
    let t = &dc.text;
    let (hd, hb) = (t.hidden_size, a.backbone_hidden_size);
    if hb != target.text.hidden_size {
        return Err(Error::Invalid(format!(
            "drafter backbone_hidden_size {hb} ≠ target hidden {}",
            target.text.hidden_size
        )));
    }
    let mut d = vec![0u32; DH_WORDS];
    d[DH_HIDDEN] = hd as u32;
    d[DH_BACKBONE] = hb as u32;
    d[DH_LAYERS] = dc.layers.len() as u32;
    d[DH_EPS] = t.rms_norm_eps.to_bits();
    d[DH_WINDOW] = t.sliding_window as u32;
    d[DH_PRE] = b.matrix(&aw.pre_projection)?;
    d[DH_POST] = b.matrix(&aw.post_projection)?;
    d[DH_EMBED] = b.matrix(&dw.embed)?;
    d[DH_FINAL_NORM] = b.vec(&dw.final_norm);
    d[DH_TARGET_EMBED] = head[H_EMBED];
    d[DH_EMBED_SCALE] = crate::reference::embed_scale(hb).to_bits();
    match (&aw.centroids, &aw.token_ordering) {
        (Some(cm), Some(order)) if a.use_ordered_embeddings => {
            if a.centroid_intermediate_top_k > MAX_TOPK_C {
                return Err(Error::Invalid(format!(
                    "drafter keeps {} centroids: the Metal kernels keep at most {MAX_TOPK_C}",
                    a.centroid_intermediate_top_k
                )));
            }
            d[DH_CENTROIDS] = b.matrix(cm)?;
            d[DH_ORDER] = b.bytes(0, bytemuck::cast_slice(order))?;
            d[DH_N_CENTROIDS] = a.num_centroids as u32;
            d[DH_TOPK_C] = a.centroid_intermediate_top_k as u32;
        }
        _ => d[DH_CENTROIDS] = NONE,
    }
    let mut layers = Vec::with_capacity(dc.layers.len() * L_WORDS);
    let (mut max_q, mut max_mlp) = (0, 0);
    for (l, lw) in dc.layers.iter().zip(&dw.layers) {
        let producer = target.producer(l.kind).ok_or_else(|| {
            Error::Invalid(format!("the target has no cache-owning {:?} layer for the drafter to read", l.kind))
        })?;
        let c = kv.read_cache[producer];
        let cs = &kv.caches[c];
        if cs.head_dim != l.head_dim || l.n_heads % cs.n_kv_heads != 0 || l.head_dim > 512 {
            return Err(Error::Invalid(format!(
                "drafter layer {}: {} heads × {} cannot attend to the target's {} KV heads × {}",
                l.index, l.n_heads, l.head_dim, cs.n_kv_heads, cs.head_dim
            )));
        }
        let mut r = vec![NONE; L_WORDS];
        r[L_KIND] = (l.kind == AttnKind::Full) as u32;
        r[L_HEAD_DIM] = l.head_dim as u32;
        r[L_HEADS] = l.n_heads as u32;
        r[L_KV_HEADS] = cs.n_kv_heads as u32;
        (r[L_K_OFF], r[L_V_OFF]) = (cache_off[c].0 as u32, cache_off[c].1 as u32);
        r[L_SLOTS] = cs.slots as u32;
        r[L_MLP] = l.mlp_width as u32;
        r[L_IN_NORM] = b.vec(&lw.input_norm);
        r[L_Q_NORM] = b.vec(&lw.q_norm);
        r[L_POST_ATTN] = b.vec(&lw.post_attn_norm);
        r[L_PRE_FF] = b.vec(&lw.pre_ff_norm);
        r[L_POST_FF] = b.vec(&lw.post_ff_norm);
        r[L_SCALAR] = lw.layer_scalar.to_bits();
        r[L_Q] = b.matrix(&lw.q_proj)?;
        r[L_O] = b.matrix(&lw.o_proj)?;
        r[L_GATE] = b.matrix(&lw.gate_proj)?;
        r[L_UP] = b.matrix(&lw.up_proj)?;
        r[L_DOWN] = b.matrix(&lw.down_proj)?;
        max_q = max_q.max(l.q_dim());
        max_mlp = max_mlp.max(l.mlp_width);
        layers.extend_from_slice(&r);
    }
    let mut region = |n: usize| {
        let o = *act_len;
        *act_len += n.div_ceil(4) * 4;
        o as u32
    };
    d[DA_X] = region(hd);
    d[DA_XG] = region(groups * hd);
    d[DA_Q] = region(max_q);
    d[DA_ATT] = region(max_q);
    d[DA_O] = region(hd);
    d[DA_GU] = region(max_mlp);
    d[DA_M] = region(hd);
    d[DA_H] = region(2 * hb);
    d[DA_SCORES] = region(a.num_centroids.max(1));
    d[DA_BEST] = region(2 * warps);
    d[DA_TOK] = region(MAX_M);
    d[DH_STEP_HIDDEN] = step_at as u32;
    Ok((d, layers))
}

/// Checks that the kernels can run `cfg` at all (before any weight is copied).
pub fn check_supported(cfg: &Config) -> Result<()> {
    let t = &cfg.text;
    if t.enable_moe_block && (t.top_k_experts > MAX_TOPK || t.num_experts > MAX_EXPERTS) {
        return Err(Error::Invalid(format!(
            "{} experts, top-{}: the Metal kernels route at most {MAX_EXPERTS} experts and {MAX_TOPK} per token",
            t.num_experts, t.top_k_experts
        )));
    }
    for l in &cfg.layers {
        if l.head_dim > 512 || l.head_dim % 2 != 0 {
            return Err(Error::Invalid(format!(
                "layer {}: head_dim {} is not one the Metal kernels hold in SIMD-group registers (even, at most 512)",
                l.index, l.head_dim
            )));
        }
        if l.n_heads % l.n_kv_heads != 0 {
            return Err(Error::Invalid(format!(
                "layer {}: {} heads over {} KV heads",
                l.index, l.n_heads, l.n_kv_heads
            )));
        }
    }
    Ok(())
}

/// Packs `w` for the kernels, with the KV caches laid out as `kv`, for launches of `groups`
/// threadgroups of `warps` SIMD-groups in all (each group's residual copy, the argmax partials).
pub fn pack(
    cfg: &Config,
    w: &ModelWeights,
    kv: &KvLayout,
    groups: usize,
    warps: usize,
    installed: Option<&InstalledExperts>,
    drafter: Option<(&Config, &ModelWeights)>,
) -> Result<Packed> {
    check_supported(cfg)?;
    let t = &cfg.text;
    let h = t.hidden_size;
    let mut b = Builder { arenas: [Vec::new(), Vec::new()], descs: Vec::new() };
    let mut head = vec![0u32; H_WORDS];
    let f = |x: f32| x.to_bits();

    head[H_HIDDEN] = h as u32;
    head[H_VOCAB] = t.vocab_size as u32;
    head[H_LAYERS] = cfg.layers.len() as u32;
    head[H_EPS] = f(t.rms_norm_eps);
    head[H_SOFTCAP] = f(t.final_logit_softcapping.unwrap_or(0.0));
    head[H_EMBED] = b.matrix(&w.embed)?;
    head[H_EMBED_SCALE] = f(crate::reference::embed_scale(h));
    head[H_INV_SQRT_H] = f((h as f64).powf(-0.5) as f32);
    head[H_FINAL_NORM] = b.vec(&w.final_norm);
    let pd = if cfg.has_ple() { t.hidden_size_per_layer_input } else { 0 };
    head[H_PLE_DIM] = pd as u32;
    match &w.ple {
        Some(p) if pd > 0 => {
            head[H_PLE_EMBED] = b.matrix(&p.embed)?;
            head[H_PLE_PROJ] = b.matrix(&p.model_projection)?;
            head[H_PLE_NORM] = b.vec(&p.projection_norm);
            head[H_SQRT_PLE] = f((pd as f64).sqrt() as f32);
        }
        _ => {
            head[H_PLE_EMBED] = NONE;
            head[H_PLE_PROJ] = NONE;
            head[H_PLE_NORM] = NONE;
        }
    }

    // KV caches: K then V of each owning layer, in cache order.
    let mut cache_off = Vec::new();
    let mut kv_len = 0usize;
    for c in &kv.caches {
        let n = c.slots * c.slot_elems();
        cache_off.push((kv_len, kv_len + n));
        kv_len += 2 * n;
    }

    let mut layers = Vec::with_capacity(cfg.layers.len() * L_WORDS);
    let mut expert_regions = std::collections::BTreeMap::new();
    let (mut max_q, mut max_kv, mut max_mlp) = (0, 0, 0);
    for (l, lw) in cfg.layers.iter().zip(&w.layers) {
        let mut r = vec![0u32; L_WORDS];
        let cache = kv.read_cache[l.index];
        r[L_KIND] = (l.kind == AttnKind::Full) as u32;
        r[L_HEAD_DIM] = l.head_dim as u32;
        r[L_HEADS] = l.n_heads as u32;
        r[L_KV_HEADS] = l.n_kv_heads as u32;
        r[L_K_OFF] = cache_off[cache].0 as u32;
        r[L_V_OFF] = cache_off[cache].1 as u32;
        r[L_SLOTS] = kv.caches[cache].slots as u32;
        r[L_WRITES_KV] = l.owns_kv() as u32;
        r[L_K_EQ_V] = (l.owns_kv() && lw.v_proj.is_none()) as u32;
        r[L_MLP] = l.mlp_width as u32;
        r[L_WINDOW] = t.sliding_window as u32;
        r[L_IN_NORM] = b.vec(&lw.input_norm);
        r[L_Q_NORM] = b.vec(&lw.q_norm);
        r[L_K_NORM] = lw.k_norm.as_ref().map_or(NONE, |v| b.vec(v));
        r[L_POST_ATTN] = b.vec(&lw.post_attn_norm);
        r[L_PRE_FF] = b.vec(&lw.pre_ff_norm);
        r[L_POST_FF] = b.vec(&lw.post_ff_norm);
        r[L_SCALAR] = f(lw.layer_scalar);
        r[L_Q] = b.matrix(&lw.q_proj)?;
        r[L_K] = match &lw.k_proj {
            Some(m) => b.matrix(m)?,
            None => NONE,
        };
        r[L_V] = match &lw.v_proj {
            Some(m) => b.matrix(m)?,
            None => NONE,
        };
        r[L_O] = b.matrix(&lw.o_proj)?;
        r[L_GATE] = b.matrix(&lw.gate_proj)?;
        r[L_UP] = b.matrix(&lw.up_proj)?;
        r[L_DOWN] = b.matrix(&lw.down_proj)?;
        match (&lw.ple, pd > 0) {
            (Some(p), true) => {
                r[L_PLE_GATE] = b.matrix(&p.input_gate)?;
                r[L_PLE_PROJ] = b.matrix(&p.projection)?;
                r[L_PLE_POST] = b.vec(&p.post_norm);
            }
            _ => {
                r[L_PLE_GATE] = NONE;
                r[L_PLE_PROJ] = NONE;
                r[L_PLE_POST] = NONE;
            }
        }
        for w in &mut r[L_MOE..=L_EXPERTS] {
            *w = NONE;
        }
        r[L_MOE] = 0;
        if let Some(moe) = &lw.moe {
            let layer = l.index;
            let iw = t.moe_intermediate_size;
            r[L_MOE] = 1;
            r[L_ROUTER] = b.matrix(&moe.router_proj)?;
            r[L_ROUTER_SCALE] = b.vec(&moe.router_scale);
            r[L_EXPERT_SCALE] = b.vec(&moe.per_expert_scale);
            r[L_PRE_NORM_2] = b.vec(&moe.pre_norm_2);
            r[L_POST_NORM_1] = b.vec(&moe.post_norm_1);
            r[L_POST_NORM_2] = b.vec(&moe.post_norm_2);
            match (&moe.experts, installed) {
                (Some(st), _) => {
                    // Expert e's gate rows start at e · stride; its up rows `up_base` rows later in
                    // the up matrix (the same fused matrix in HF form, their own in MLX form).
                    match &st.gate_up {
                        ExpertGateUp::Fused(m) => {
                            let d = b.matrix_in(1, m)?;
                            (r[L_E_GATE], r[L_E_UP], r[L_E_GATE_STRIDE], r[L_E_UP_BASE]) =
                                (d, d, 2 * iw as u32, iw as u32);
                        }
                        ExpertGateUp::Split { gate, up } => {
                            r[L_E_GATE] = b.matrix_in(1, gate)?;
                            r[L_E_UP] = b.matrix_in(1, up)?;
                            (r[L_E_GATE_STRIDE], r[L_E_UP_BASE]) = (iw as u32, 0);
                        }
                    }
                    r[L_E_DOWN] = b.matrix_in(1, &st.down)?;
                    (r[L_E_DOWN_STRIDE], r[L_E_SLOT_WORDS], r[L_E_SLOT_MAP]) = (h as u32, 0, 0);
                }
                (None, Some(inst)) => {
                    // Each slot holds one blob: the parts at fixed offsets, one expert's rows each.
                    let lay = inst.layout;
                    if !lay.blob_stride.is_multiple_of(4) {
                        return Err(Error::Invalid(format!(
                            "expert blob stride {} is not whole words",
                            lay.blob_stride
                        )));
                    }
                    let region = b.zeros(1, inst.slots * lay.blob_stride as usize)?;
                    expert_regions.insert(layer, region);
                    let part = |b: &mut Builder, role: &str| -> Result<u32> {
                        let p = lay
                            .part(role)
                            .ok_or_else(|| Error::Invalid(format!("expert layout has no `{role}` part")))?;
                        b.blob_part(region, p)
                    };
                    match lay.part("gate_up") {
                        Some(_) => {
                            let d = part(&mut b, "gate_up")?;
                            (r[L_E_GATE], r[L_E_UP], r[L_E_UP_BASE]) = (d, d, iw as u32);
                        }
                        None => {
                            r[L_E_GATE] = part(&mut b, "gate")?;
                            r[L_E_UP] = part(&mut b, "up")?;
                            r[L_E_UP_BASE] = 0;
                        }
                    }
                    r[L_E_DOWN] = part(&mut b, "down")?;
                    (r[L_E_GATE_STRIDE], r[L_E_DOWN_STRIDE]) = (0, 0);
                    r[L_E_SLOT_WORDS] = (lay.blob_stride / 4) as u32;
                    r[L_E_SLOT_MAP] = inst.streamed as u32;
                }
                (None, None) => {
                    return Err(Error::Invalid(
                        "MoE layer without expert weights (an installation opened without its expert files)".into(),
                    ))
                }
            }
            r[L_E_WIDTH] = iw as u32;
            r[L_TOPK] = t.top_k_experts as u32;
            r[L_EXPERTS] = t.num_experts as u32;
        }
        max_q = max_q.max(l.q_dim());
        max_kv = max_kv.max(l.kv_dim());
        max_mlp = max_mlp.max(l.mlp_width);
        layers.extend_from_slice(&r);
    }

    // Activations: each region its own, so no stage overwrites what another still reads.
    let mut act_len = 0usize;
    let mut region = |n: usize| {
        let o = act_len;
        act_len += n.div_ceil(4) * 4;
        o as u32
    };
    // Every region holds MAX_M tokens' rows at its stride.
    let (e, k, iw) =
        if t.enable_moe_block { (t.num_experts, t.top_k_experts, t.moe_intermediate_size) } else { (0, 0, 0) };
    head[H_S_Q] = max_q as u32;
    head[H_S_KV] = max_kv as u32;
    head[H_S_GU] = max_mlp as u32;
    head[H_S_SCORES] = e as u32;
    head[H_S_EGU] = (k * iw) as u32;
    head[H_S_ED] = (k * h) as u32;
    head[A_Q] = region(MAX_M * max_q);
    head[A_K] = region(MAX_M * max_kv);
    head[A_V] = region(MAX_M * max_kv);
    head[A_ATT] = region(MAX_M * max_q);
    head[A_O] = region(MAX_M * h);
    head[A_GU] = region(MAX_M * max_mlp);
    head[A_M] = region(MAX_M * h);
    head[A_PLE] = region(MAX_M * cfg.layers.len() * pd);
    head[A_PG] = region(MAX_M * pd);
    head[A_PY] = region(MAX_M * h);
    head[A_BEST] = region(2 * MAX_M * warps);
    head[A_SCORES] = region(MAX_M * e);
    head[A_EGU] = region(MAX_M * k * iw);
    head[A_ED] = region(MAX_M * k * h);
    head[A_XG] = region(groups * MAX_M * h);

    let rope_half = [t.rope_sliding.head_dim / 2, t.rope_full.head_dim / 2];
    let rope_stride = 2 * (rope_half[0] + rope_half[1]);
    head[H_ROPE_S] = STEP_ROPE as u32;
    head[H_ROPE_F] = (STEP_ROPE + 2 * rope_half[0]) as u32;
    head[H_ROPE_STRIDE] = rope_stride as u32;
    head[H_STEP_MAP] = (STEP_ROPE + MAX_M * rope_stride) as u32;
    let step_len = head[H_STEP_MAP] as usize + e;
    head[H_OUT_LOGITS] = OUT_LOGITS as u32;
    head[H_OUT_HIDDEN] = (OUT_LOGITS + MAX_M * t.vocab_size) as u32;
    let out_len = OUT_LOGITS + MAX_M * (t.vocab_size + h);

    head[H_LAYER_BASE] = H_WORDS as u32;
    head[H_DESC_BASE] = (H_WORDS + layers.len()) as u32;
    let mut step_len = step_len;
    let draft = match drafter {
        Some((dc, dw)) => {
            let d = pack_drafter(&mut b, cfg, &head, kv, &cache_off, dc, dw, groups, warps, &mut act_len, step_len)?;
            step_len += cfg.text.hidden_size;
            Some(d)
        }
        None => None,
    };
    let mut table = head;
    table.extend_from_slice(&layers);
    table.extend_from_slice(&b.descs);
    if let Some((mut dhead, dlayers)) = draft {
        table[H_DRAFT] = table.len() as u32;
        dhead[DH_LAYER_BASE] = (table.len() + DH_WORDS) as u32;
        table.extend_from_slice(&dhead);
        table.extend_from_slice(&dlayers);
    }
    let [arena, arena_b] = b.arenas;
    Ok(Packed {
        table,
        arena,
        arena_b,
        act_len,
        kv_len,
        step_len,
        out_len,
        rope_half,
        cache_offsets: cache_off,
        expert_regions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `NAME = value` of the enums at the top of decode.metal equals the constant here.
    #[test]
    fn table_layout_matches_the_msl() {
        let msl = concat!(include_str!("../../../msl/decode.metal"), include_str!("../../../msl/draft.metal"));
        let ours: &[(&str, usize)] = &[
            ("H_HIDDEN", H_HIDDEN),
            ("H_VOCAB", H_VOCAB),
            ("H_LAYERS", H_LAYERS),
            ("H_EPS", H_EPS),
            ("H_SOFTCAP", H_SOFTCAP),
            ("H_PLE_DIM", H_PLE_DIM),
            ("H_EMBED", H_EMBED),
            ("H_EMBED_SCALE", H_EMBED_SCALE),
            ("H_PLE_EMBED", H_PLE_EMBED),
            ("H_PLE_PROJ", H_PLE_PROJ),
            ("H_PLE_NORM", H_PLE_NORM),
            ("H_FINAL_NORM", H_FINAL_NORM),
            ("H_LAYER_BASE", H_LAYER_BASE),
            ("H_DESC_BASE", H_DESC_BASE),
            ("H_ROPE_S", H_ROPE_S),
            ("H_ROPE_F", H_ROPE_F),
            ("H_INV_SQRT_H", H_INV_SQRT_H),
            ("H_SQRT_PLE", H_SQRT_PLE),
            ("H_OUT_LOGITS", H_OUT_LOGITS),
            ("H_OUT_HIDDEN", H_OUT_HIDDEN),
            ("A_Q", A_Q),
            ("A_K", A_K),
            ("A_V", A_V),
            ("A_ATT", A_ATT),
            ("A_O", A_O),
            ("A_GU", A_GU),
            ("A_M", A_M),
            ("A_PLE", A_PLE),
            ("A_PG", A_PG),
            ("A_PY", A_PY),
            ("A_BEST", A_BEST),
            ("A_SCORES", A_SCORES),
            ("A_EGU", A_EGU),
            ("A_ED", A_ED),
            ("A_XG", A_XG),
            ("H_STEP_MAP", H_STEP_MAP),
            ("H_S_Q", H_S_Q),
            ("H_S_KV", H_S_KV),
            ("H_S_GU", H_S_GU),
            ("H_ROPE_STRIDE", H_ROPE_STRIDE),
            ("H_S_SCORES", H_S_SCORES),
            ("H_S_EGU", H_S_EGU),
            ("H_S_ED", H_S_ED),
            ("H_DRAFT", H_DRAFT),
            ("DH_HIDDEN", DH_HIDDEN),
            ("DH_BACKBONE", DH_BACKBONE),
            ("DH_LAYERS", DH_LAYERS),
            ("DH_EPS", DH_EPS),
            ("DH_WINDOW", DH_WINDOW),
            ("DH_PRE", DH_PRE),
            ("DH_POST", DH_POST),
            ("DH_EMBED", DH_EMBED),
            ("DH_FINAL_NORM", DH_FINAL_NORM),
            ("DH_CENTROIDS", DH_CENTROIDS),
            ("DH_ORDER", DH_ORDER),
            ("DH_N_CENTROIDS", DH_N_CENTROIDS),
            ("DH_TOPK_C", DH_TOPK_C),
            ("DH_LAYER_BASE", DH_LAYER_BASE),
            ("DH_TARGET_EMBED", DH_TARGET_EMBED),
            ("DH_EMBED_SCALE", DH_EMBED_SCALE),
            ("DH_STEP_HIDDEN", DH_STEP_HIDDEN),
            ("DA_X", DA_X),
            ("DA_XG", DA_XG),
            ("DA_Q", DA_Q),
            ("DA_ATT", DA_ATT),
            ("DA_O", DA_O),
            ("DA_GU", DA_GU),
            ("DA_M", DA_M),
            ("DA_H", DA_H),
            ("DA_SCORES", DA_SCORES),
            ("DA_BEST", DA_BEST),
            ("DA_TOK", DA_TOK),
            ("DH_WORDS", DH_WORDS),
            ("H_WORDS", H_WORDS),
            ("L_KIND", L_KIND),
            ("L_HEAD_DIM", L_HEAD_DIM),
            ("L_HEADS", L_HEADS),
            ("L_KV_HEADS", L_KV_HEADS),
            ("L_K_OFF", L_K_OFF),
            ("L_V_OFF", L_V_OFF),
            ("L_SLOTS", L_SLOTS),
            ("L_WRITES_KV", L_WRITES_KV),
            ("L_K_EQ_V", L_K_EQ_V),
            ("L_MLP", L_MLP),
            ("L_IN_NORM", L_IN_NORM),
            ("L_Q_NORM", L_Q_NORM),
            ("L_K_NORM", L_K_NORM),
            ("L_POST_ATTN", L_POST_ATTN),
            ("L_PRE_FF", L_PRE_FF),
            ("L_POST_FF", L_POST_FF),
            ("L_SCALAR", L_SCALAR),
            ("L_Q", L_Q),
            ("L_K", L_K),
            ("L_V", L_V),
            ("L_O", L_O),
            ("L_GATE", L_GATE),
            ("L_UP", L_UP),
            ("L_DOWN", L_DOWN),
            ("L_PLE_GATE", L_PLE_GATE),
            ("L_PLE_PROJ", L_PLE_PROJ),
            ("L_PLE_POST", L_PLE_POST),
            ("L_WINDOW", L_WINDOW),
            ("L_MOE", L_MOE),
            ("L_ROUTER", L_ROUTER),
            ("L_ROUTER_SCALE", L_ROUTER_SCALE),
            ("L_EXPERT_SCALE", L_EXPERT_SCALE),
            ("L_PRE_NORM_2", L_PRE_NORM_2),
            ("L_POST_NORM_1", L_POST_NORM_1),
            ("L_POST_NORM_2", L_POST_NORM_2),
            ("L_E_GATE", L_E_GATE),
            ("L_E_UP", L_E_UP),
            ("L_E_DOWN", L_E_DOWN),
            ("L_E_GATE_STRIDE", L_E_GATE_STRIDE),
            ("L_E_UP_BASE", L_E_UP_BASE),
            ("L_E_WIDTH", L_E_WIDTH),
            ("L_TOPK", L_TOPK),
            ("L_EXPERTS", L_EXPERTS),
            ("L_E_DOWN_STRIDE", L_E_DOWN_STRIDE),
            ("L_E_SLOT_WORDS", L_E_SLOT_WORDS),
            ("L_E_SLOT_MAP", L_E_SLOT_MAP),
            ("L_WORDS", L_WORDS),
            ("D_FMT", D_FMT),
            ("D_ROWS", D_ROWS),
            ("D_COLS", D_COLS),
            ("D_W", D_W),
            ("D_S", D_S),
            ("D_B", D_B),
            ("D_GROUP", D_GROUP),
            ("D_ARENA", D_ARENA),
            ("D_WORDS", D_WORDS),
            ("FMT_F32", FMT_F32 as usize),
            ("FMT_BF16", FMT_BF16 as usize),
            ("FMT_F16", FMT_F16 as usize),
            ("FMT_Q4", FMT_Q4 as usize),
            ("FMT_Q8", FMT_Q8 as usize),
        ];
        // The enum bodies: `enum : uint { A = 0, B = 1, … };`
        let mut theirs = std::collections::BTreeMap::new();
        for body in msl.split("enum : uint {").skip(1) {
            let body = &body[..body.find("};").expect("enum closes")];
            for item in body.split(',') {
                if let Some((k, v)) = item.split_once('=') {
                    theirs.insert(k.trim().to_string(), v.trim().parse::<usize>().expect("numeric enum value"));
                }
            }
        }
        for &(name, value) in ours {
            assert_eq!(theirs.get(name), Some(&value), "{name} differs between pack.rs and decode.metal");
        }
        assert_eq!(theirs.len(), ours.len(), "the MSL has table words pack.rs does not know");
    }
}
