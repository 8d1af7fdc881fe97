//! The params structs of the kernels: each is `#[repr(C)]` and has a struct of the same name and
//! field order in the kernel sources (the WGSL in `wgsl/`, the MSL in `msl/`), so the host writes
//! its bytes into a uniform the kernel reads as is. Counts are element counts (u32), never byte
//! offsets; every struct is padded to 16 bytes (uniform layout rules). Which kernel reads which
//! struct is in its source file's header; the last block here (barrier and chain params) belongs
//! to the benchmark probes, not the forward pass.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};

/// Per-step values every kernel reads (`Step` in the WGSL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Step {
    pub n_tokens: u32,
    pub pos0: u32,
    pub n_out: u32,
    pub out_row0: u32,
    /// 1 in a verify step: the step's own K/V go to the staging rows after the cache's slots.
    pub staged: u32,
    pub _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatmulParams {
    pub rows: u32,
    pub cols: u32,
    pub gs: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub y_off: u32,
    pub count_sel: u32,
    /// qmm / qmm_sum: ranges the k loop is split into (0 or 1: none).
    pub k_splits: u32,
}

/// Params of the gated qmv (matmul_gb_params.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct QmvGeluParams {
    pub m: MatmulParams,
    /// f32 elements between tokens in `gb`.
    pub b_stride: u32,
    /// First element of the gating row.
    pub b_off: u32,
    pub _pad: [u32; 2],
}

/// Params of the fused-norm prologue (qmv_norm.wgsl's NormPro), a second uniform binding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct NormPro {
    /// Offsets of the two norms' weights in the norm weights buffer.
    pub w1: u32,
    pub post1: f32,
    pub w2: u32,
    pub post2: f32,
    pub eps: f32,
    /// 1: the input is the second norm of the updated residual; 0: the residual itself.
    pub second: u32,
    pub _pad: [u32; 2],
}

/// Sentinel for "no norm weight" (`NO_WEIGHT` in the WGSL).
pub const NO_WEIGHT: u32 = u32::MAX;

/// group_sum.wgsl's params: `xsum[r · G + g] = Σ x[r · stride + g · gs ..][..gs]` for rows
/// r < count · mult, G = cols / gs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GroupSumParams {
    pub cols: u32,
    pub gs: u32,
    pub stride: u32,
    /// x rows per token (a routed expert's x: top_k).
    pub mult: u32,
    pub count_sel: u32,
    pub _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct EmbedParams {
    pub rows: u32,
    pub cols: u32,
    pub gs: u32,
    pub row0: u32,
    pub scale: f32,
    pub _pad: [u32; 3],
}

/// Params of the MTP drafter's centroid head (draft_params.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct DraftHeadParams {
    pub n_centroids: u32,
    pub top_k: u32,
    /// Tokens per cluster (vocab / n_centroids).
    pub per: u32,
    pub cols: u32,
    pub gs: u32,
    pub row0: u32,
    pub rows: u32,
    pub _pad: u32,
}

/// Params of a speculative round's device-side acceptance (spec_params.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SpecParams {
    pub k: u32,
    pub elems: u32,
    pub rows: u32,
    pub mode: u32,
    pub slots: u32,
    pub ring: u32,
    pub dst_off: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct NormParams {
    pub n: u32,
    pub segs: u32,
    pub x_stride: u32,
    pub x_row_sel: u32,
    pub out_stride: u32,
    pub w_off: u32,
    pub mode: u32,
    pub count_sel: u32,
    pub pre: f32,
    pub post: f32,
    pub eps: f32,
    /// 1..=3: also write that many norms of the updated `out` rows (weights at `w2_off`,
    /// `w3_off`, `w4_off`, scaled by `post2..4`) to the second to fourth outputs, rows
    /// `out2_stride` apart.
    pub chain: u32,
    pub w2_off: u32,
    pub out2_stride: u32,
    pub w3_off: u32,
    pub w4_off: u32,
    pub post2: f32,
    pub post3: f32,
    pub post4: f32,
    /// The rows form with sums (`RmsNormRows { sums: true }`): group size of the sums, a bit per output
    /// whose sums are written (0: out, 1..3: out2..out4) and where each output's sums start in
    /// xsum (rows of n / gs floats per token).
    pub gs: u32,
    pub sums: u32,
    pub sum_off: [u32; 4],
    /// The rows form over a split-k mat-mat's partials (`RmsNormRows { parts: true }`): x is
    /// the sum of this many partials, rows `s · count + t` of `part` (qmm_sum's layout and
    /// order).
    pub splits: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct HeadParams {
    pub d: u32,
    pub n_heads: u32,
    pub src_stride: u32,
    pub w_off: u32,
    pub rope: u32,
    pub rope_off: u32,
    pub rope_stride: u32,
    pub dst_mode: u32,
    pub slots: u32,
    pub eps: f32,
    /// Offset of head 0 within each src row (q, k, v stacked in one projection).
    pub src_off: u32,
    pub _pad: u32,
}

/// `QkvParams` of qkv_norm_rope.wgsl: q heads read at offset 0 of each src row, k heads at
/// `k_off`, v heads at `v_off` (= k_off for K-as-V layers); q and k norm weights at `q_w`, `k_w`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct QkvParams {
    pub d: u32,
    pub src_stride: u32,
    pub rope_off: u32,
    pub rope_stride: u32,
    pub n_q: u32,
    pub n_kv: u32,
    pub k_off: u32,
    pub v_off: u32,
    pub q_w: u32,
    pub k_w: u32,
    pub slots: u32,
    pub eps: f32,
}

/// Params of attention_split's q-norm form (`QNormParams` in attention_qnorm.wgsl): where each
/// token's q heads start before their norm, the norm weight and the rope table's row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct QNormParams {
    pub src_stride: u32,
    pub src_off: u32,
    pub w_off: u32,
    pub rope_off: u32,
    pub rope_stride: u32,
    pub eps: f32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttnParams {
    pub d: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub slots: u32,
    pub window: u32,
    /// Key splits of attention_split / attention_combine (unused by attention).
    pub n_splits: u32,
    /// Rows of at most this many keys are attention_short's; attention_split and
    /// attention_combine take the others (0: every row theirs). Unused by chunk attention.
    pub short_max: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GeluParams {
    pub n: u32,
    pub a_stride: u32,
    pub b_stride: u32,
    pub b_off: u32,
    /// 1: the up values are in `a` itself, at `b_off` within each row (stacked gate/up).
    pub b_in_a: u32,
    /// `GeluMulSums` only: > 1, a is read as the sum of this many split-k partials (binding 5).
    pub splits: u32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxParams {
    pub vocab: u32,
    pub cap: f32,
    /// Chunks of [`ARGMAX_CHUNK`](super::ARGMAX_CHUNK) logits per row:
    /// [`argmax_chunks`](super::argmax_chunks).
    pub chunks: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RouterParams {
    pub n_experts: u32,
    pub top_k: u32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MoeMatmulParams {
    pub rows: u32,
    pub cols: u32,
    pub gs: u32,
    pub expert_stride: u32,
    pub row_off: u32,
    pub top_k: u32,
    pub x_tok_stride: u32,
    pub x_slot_stride: u32,
    pub y_stride: u32,
    /// u32 words between groups in moe_group's lists (moe_matmul_grouped, qmm_moe).
    pub group_stride: u32,
    /// The up rows of a fused gate_up stack, per expert (qmv_moe_glu only).
    pub up_off: u32,
    /// Lists in moe_group's buffer (qmm_moe only).
    pub n_groups: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GroupParams {
    pub top_k: u32,
    pub stride: u32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CombineParams {
    pub n: u32,
    pub top_k: u32,
    pub _pad: [u32; 2],
}

/// Params of moe_norm.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MoeNormParams {
    /// Values per row.
    pub n: u32,
    /// Where the dense branch's and the routed branch's post-norm weights start in the norm
    /// weight buffer.
    pub w1_off: u32,
    pub w2_off: u32,
    pub eps: f32,
    /// Scales after the dense branch's norm and after the sum.
    pub post1: f32,
    pub post2: f32,
    pub _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CopyParams {
    /// vec4 elements to copy.
    pub n: u32,
    pub _pad: [u32; 3],
}

/// Params of grid_barrier.wgsl and last_workgroup.wgsl (barrier_params.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BarrierParams {
    /// Barriers per dispatch (≥ 2); last_workgroup: values per workgroup (≤ 256).
    pub rounds: u32,
    pub _pad: [u32; 3],
}

/// Stages one [`ChainParams`] holds (persistent_chain.wgsl's `{{MAX_STAGES}}`).
pub const MAX_CHAIN_STAGES: usize = 128;

/// One mat-vec of persistent_chain.wgsl: `rows` × `cols` (multiples of 16 and 512), its
/// weights from vec4 `w` and scale-bias words from `sb`, reading activations at `x` and
/// writing them at `y`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ChainStage {
    pub rows: u32,
    pub cols: u32,
    pub w: u32,
    pub sb: u32,
    pub x: u32,
    pub y: u32,
    pub _pad: [u32; 2],
}

/// Params of persistent_chain.wgsl: the stages this dispatch runs (`first`, `count`), where a
/// stage's first weights are loaded against the grid barrier before it (`prefetch`, a
/// [`ChainPrefetch`]), and the whole chain's stage table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct ChainParams {
    pub first: u32,
    pub count: u32,
    pub prefetch: u32,
    pub _pad: u32,
    pub stages: [ChainStage; MAX_CHAIN_STAGES],
}

/// Where persistent_chain.wgsl finds a chain's parts: the stage table, and the vec4s of
/// weights, scale-bias words and activation values the chain spans.
#[derive(Clone, Debug)]
pub struct ChainLayout {
    pub stages: Vec<ChainStage>,
    pub w_vec4s: usize,
    pub sb_words: usize,
    pub act_values: usize,
}

/// The layout of a chain of mat-vecs of `shapes` (rows, cols): stage 0 reads the input at
/// activation 0, each later stage the first `cols` values of the stage before's output; every
/// stage's weights, scale-bias words and output follow the previous one's.
pub fn chain_layout(shapes: &[(u32, u32)]) -> Result<ChainLayout> {
    if shapes.is_empty() || shapes.len() > MAX_CHAIN_STAGES {
        return Err(Error::Invalid(format!("a chain has 1 to {MAX_CHAIN_STAGES} stages, not {}", shapes.len())));
    }
    let (mut w, mut sb, mut x, mut act) = (0usize, 0usize, 0usize, shapes[0].1 as usize);
    let mut stages = Vec::with_capacity(shapes.len());
    for (i, &(rows, cols)) in shapes.iter().enumerate() {
        let prev = if i == 0 { cols } else { shapes[i - 1].0 };
        if rows == 0 || rows % 16 != 0 || cols == 0 || cols % 512 != 0 || cols > prev {
            return Err(Error::Invalid(format!("chain stage {i}: {rows} × {cols} needs rows a multiple of 16, cols a multiple of 512 and at most the {prev} values before it")));
        }
        let at = |v: usize| u32::try_from(v).map_err(|_| Error::Invalid(format!("chain stage {i}: offsets past 2^32")));
        stages.push(ChainStage { rows, cols, w: at(w)?, sb: at(sb)?, x: at(x)?, y: at(act)?, _pad: [0; 2] });
        w += rows as usize * cols as usize / 32;
        sb += rows as usize * cols as usize / 64;
        x = act;
        act += rows as usize;
    }
    Ok(ChainLayout { stages, w_vec4s: w, sb_words: sb, act_values: act })
}

/// Where a persistent_chain workgroup loads its first weights of a stage, against the grid
/// barrier before the stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainPrefetch {
    /// After the barrier, as a new dispatch would.
    After = 0,
    /// Before the barrier's release fence.
    Before = 1,
    /// Between this workgroup's arrival and its wait for the others.
    Inside = 2,
}

/// Params of a persistent_chain dispatch running stages `first` … `first + count − 1` of `layout`.
pub fn chain_params(layout: &ChainLayout, first: u32, count: u32, prefetch: ChainPrefetch) -> ChainParams {
    let mut stages = [ChainStage::default(); MAX_CHAIN_STAGES];
    stages[..layout.stages.len()].copy_from_slice(&layout.stages);
    ChainParams { first, count, prefetch: prefetch as u32, _pad: 0, stages }
}
