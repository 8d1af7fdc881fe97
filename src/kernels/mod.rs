//! The kernel contracts every backend implements: which kernels exist ([`Kernel`], one variant per
//! kernel family with its compile-time shape as fields), the names a profile or an error shows
//! for each ([`Kernel::label`]), the buffers each binds and in which order ([`Kernel::bindings`]),
//! the params structs their uniforms carry ([`params`]), the rules that pick a kernel form for a
//! matrix or a row ([`shape`]: pure functions of the shape, the device's limits and the
//! [`Tuning`]) and the tuning itself ([`tuning`]).
//!
//! Nothing here knows a graphics API. The wgpu backend turns a [`Kernel`] into WGSL
//! (`backend/wgpu/source.rs`) and a pipeline (`backend/wgpu/pipelines.rs`); a Metal backend turns
//! the same [`Kernel`] into an MSL phase with the same buffers and params, so one case table
//! can test both against the CPU reference (`tests/kernels.rs`).

pub mod params;
pub mod runner;
pub mod shape;
pub mod tuning;

pub use params::*;
pub use runner::KernelRunner;
pub use shape::*;
pub use tuning::{Tuning, WideFuse};

/// A weight format as stored on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Q4,
    Q8,
    Bf16,
    F32,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Q4 => "q4",
            Format::Q8 => "q8",
            Format::Bf16 => "bf16",
            Format::F32 => "f32",
        }
    }
}

/// The kernels of the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `tokens`: tokens per workgroup tile (`TOK` in matmul.wgsl): 1 for decode, 8 for chunks.
    Matmul(Format, u32),
    /// The 4-bit mat-vec of decode (`tok` 1) and verify steps: `lanes` per row, `rpt` rows per
    /// team of lanes (see qmv.wgsl and [`qmv_shape`]).
    /// `pro` > 0: the fused-norm form (qmv_norm.wgsl) over rows of 4 · `pro` values, whose
    /// prologue with `digits` turns the normed x into integer digits once per workgroup and whose
    /// loop multiplies packed nibbles by them (qmv_digits.wgsl; false: the float loop). `digits`
    /// is false wherever `pro` is 0.
    Qmv {
        tok: u32,
        lanes: u32,
        rpt: u32,
        pro: u32,
        digits: bool,
    },
    /// `Qmv` over a stacked [gate; up] matrix with the GeGLU as epilogue (qmv.wgsl's GeGLU
    /// form): `pairs` output rows per team.
    QmvGlu {
        tok: u32,
        lanes: u32,
        pairs: u32,
        pro: u32,
        digits: bool,
    },
    /// `Qmv` with the gated epilogue `gelu_tanh(y) · gb[..]` (qmv.wgsl's gated form).
    QmvGeluB {
        tok: u32,
        lanes: u32,
        rpt: u32,
        pro: u32,
        digits: bool,
    },
    /// The 4-bit mat-mat of prefill chunks: 16 · `tm` rows × [`QMM_TOK`] tokens per workgroup.
    Qmm {
        tm: u32,
    },
    /// `Qmm` on tensor cores (f16 cooperative matrices: x split into two f16 halves, W exact in
    /// f16): 32 · `rb` rows × 64 · `tb` tokens per workgroup, qmm's bindings and split k, and x's
    /// group sums (`GroupSum`).
    QmmCoop {
        tb: u32,
        rb: u32,
    },
    /// `QmmMoe` on tensor cores (qmm_coop's tile per expert): 32 · `rb` rows × 64 · `tb` pairs.
    QmmCoopMoe {
        tb: u32,
        rb: u32,
    },
    /// `QmmCoop` over a stacked [gate; up] matrix with the GeGLU as epilogue (gelu_mul's work):
    /// 64 gate rows and their up rows × 64 · `tb` tokens per workgroup, no split k.
    QmmCoopGlu {
        tb: u32,
    },
    /// The in-order sum of a split-k `Qmm`'s partials.
    QmmSum,
    /// The sums of x over each quantisation group of its rows, for the tensor-core mat-mats
    /// whose x's producer does not write them: a thread per group.
    GroupSum,
    /// The 4-bit routed-expert mat-vec of decode and verify steps (qmv's loop per pair; `n4` > 0:
    /// x rows of 4 · n4 values staged as integer digits, qmv_digits.wgsl).
    QmvMoe {
        lanes: u32,
        rpt: u32,
        n4: u32,
    },
    /// `QmvMoe` over a fused gate_up stack with the GeGLU as epilogue (qmv_moe.wgsl's GeGLU form).
    QmvMoeGlu {
        lanes: u32,
        pairs: u32,
        n4: u32,
    },
    Embed(Format),
    /// `v`: values of a row each thread holds in registers (`V` in rmsnorm.wgsl), `wg` threads
    /// per workgroup (256, 512 or 1024), [`rmsnorm`]: decode and verify steps' form (and
    /// chunks' with `rows_norms=off`).
    RmsNorm {
        v: u32,
        wg: u32,
    },
    /// The chunk form of rmsnorm shaped for many rows (rmsnorm_rows.wgsl): `wg` threads per
    /// row (64, 128 or 256), each holding `v4` vec4s per array. The same bindings and params;
    /// see [`rmsnorm_rows`]. `sums`: also its outputs' group sums (binding 9, the tensor-core
    /// mat-mats' bias part: `NormParams::sums`). `parts`: x read as the sum of a split-k
    /// mat-mat's partials (binding 10, `NormParams::splits` of them) instead of qmm_sum's output.
    RmsNormRows {
        v4: u32,
        wg: u32,
        sums: bool,
        parts: bool,
    },
    /// One head of a projection normed and rotated per workgroup of `wg` threads (64, 128 or
    /// 256; d ≤ 4 · wg): [`head_norm_wg`].
    HeadNormRope {
        wg: u32,
    },
    /// head_norm_rope for q, k and v of a stacked projection in one dispatch.
    QkvNormRope {
        wg: u32,
    },
    /// Chunk attention (prefill; verify steps run the split form): 16 queries per workgroup share
    /// each 64-key tile; `dv` = ceil(head_dim / 64) 64-dim slices of a row (head_dim ≤ 512), in
    /// register tiles.
    Attention {
        dv: u32,
    },
    /// Chunk attention on tensor cores (attention_coop.wgsl): 32 queries per workgroup of 256
    /// threads, head dim `d` (a multiple of 64, ≤ 512); see [`attention_chunk_coop`].
    /// `sums`: the form that also writes its output's sums over each 64-dim value stage.
    AttentionCoop {
        d: u32,
        sums: bool,
    },
    /// Decode attention over key splits (`dk` = ceil(head_dim / 64) dims per lane, kept in
    /// registers), then the merge of the splits. `qnorm`: q read before its norm and rope,
    /// which the kernel applies (attention_qnorm.wgsl).
    AttentionSplit {
        dk: u32,
        qnorm: bool,
    },
    AttentionCombine,
    /// Decode and verify attention in one dispatch for rows of at most `AttnParams::short_max`
    /// keys (attention_short.wgsl): `d4` = head_dim / 4, `wg` threads per (head, token); see
    /// [`attention_short`].
    AttentionShort {
        d4: u32,
        wg: u32,
        qnorm: bool,
    },
    GeluMul,
    /// gelu_mul that also writes each token's sums of its output over groups of 64 (chunks).
    GeluMulSums,
    /// Softcap and each chunk's first maximum (pass 1 of the argmax).
    SoftcapArgmax,
    /// Each row's first maximum among its chunks' (pass 2).
    ArgmaxMerge,
    /// The MTP drafter's centroid head (draft_select / draft_score / draft_pick.wgsl): the top
    /// centroids' clusters, their tokens' logits against the drafter's embedding (of that
    /// format), the first maximum.
    DraftSelect,
    DraftScore(Format),
    DraftPick,
    /// A speculative round's acceptance on the GPU and the rows it moves (spec_accept.wgsl,
    /// spec_rows.wgsl): the next round runs without the host reading this one first.
    SpecAccept,
    SpecRows,
    /// MoE: softmax, top-k and weights of the router logits (the chosen experts' logits and
    /// scales staged in workgroup memory).
    RouterTopk,
    /// MoE: gathered mat-vec of each token's routed experts (decode).
    MoeMatmul(Format),
    /// MoE: each expert's routed pairs, listed (prefill).
    MoeGroup,
    /// MoE: each expert's rows applied to all of its pairs in the chunk (prefill).
    MoeMatmulGrouped(Format),
    /// MoE, 4-bit: qmm's tile over each expert's pairs in the chunk (prefill).
    QmmMoe,
    /// MoE: weighted sum of the routed experts' outputs.
    MoeCombine,
    /// MoE, decode and verify: the block's close in one workgroup per token (the dense
    /// branch's post-norm, moe_combine, the routed branch's post-norm onto it); `v`, `wg` as
    /// [`rmsnorm`] picks them for the row, `k` the router's top k.
    MoeNorm {
        v: u32,
        wg: u32,
        k: u32,
    },
    /// vec4 buffer copy: the bandwidth roofline of benchmarks (not part of the forward pass).
    Copy,
    /// Read-only vec4 stream (stream_read.wgsl), `vpt` vec4s per thread: the read bandwidth of
    /// one dispatch at a size, for benchmarks (not part of the forward pass).
    StreamRead {
        vpt: u32,
    },
    /// Grid-wide barriers among the workgroups of one dispatch: what one costs, for benchmarks
    /// (not part of the forward pass). `atomic`: the slots the workgroups hand each other across
    /// a barrier are atomics (atomicStore / atomicLoad), not plain stores and loads.
    GridBarrier {
        atomic: bool,
    },
    /// A producer's workgroups hand their shares of an output to the workgroup that arrives
    /// last (an atomic arrival count, no spinning): whether it sees them, and what the hand-off
    /// costs, for benchmarks (not part of the forward pass). `atomic`: the shares are atomics.
    LastWorkgroup {
        atomic: bool,
    },
    /// A chain of 4-bit mat-vecs run as one dispatch per stage or as one persistent dispatch
    /// with grid barriers between stages (persistent_chain.wgsl), for benchmarks (not part of
    /// the forward pass). `xcap`: the widest stage input it holds, in values (a multiple of 512);
    /// `pf`: vec4s of weights a lane loads at once, and ahead of a grid barrier; `wg`: threads
    /// per workgroup (16 per row of a block; stages' rows a multiple of wg / 16).
    PersistentChain {
        xcap: u32,
        pf: u32,
        wg: u32,
    },
}

/// How a kernel binds one resource (the WGSL `var<...>` it declares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bind {
    Read,
    ReadWrite,
    Uniform,
}

impl Kernel {
    pub fn label(self) -> String {
        match self {
            Kernel::Matmul(f, tok) => format!("matmul_{}_t{tok}", f.name()),
            Kernel::Qmv { tok, lanes, rpt, pro, digits } => {
                format!("qmv_q4_t{tok}_l{lanes}_r{rpt}{}", pro_label(pro, digits))
            }
            Kernel::QmvGlu { tok, lanes, pairs, pro, digits } => {
                format!("qmv_glu_q4_t{tok}_l{lanes}_p{pairs}{}", pro_label(pro, digits))
            }
            Kernel::QmvGeluB { tok, lanes, rpt, pro, digits } => {
                format!("qmv_gelu_b_q4_t{tok}_l{lanes}_r{rpt}{}", pro_label(pro, digits))
            }
            Kernel::Qmm { tm } => format!("qmm_q4_m{tm}"),
            Kernel::QmmCoop { tb, rb } => format!("qmm_coop_q4_{}x{}", 32 * rb, 64 * tb),
            Kernel::QmmCoopMoe { tb, rb } => format!("qmm_coop_moe_q4_{}x{}", 32 * rb, 64 * tb),
            Kernel::QmmCoopGlu { tb } => format!("qmm_coop_glu_q4_64x{}", 64 * tb),
            Kernel::QmmSum => "qmm_sum".into(),
            Kernel::GroupSum => "group_sum".into(),
            Kernel::QmvMoe { lanes, rpt, n4 } => {
                format!("qmv_moe_q4_l{lanes}_r{rpt}{}", if n4 > 0 { "_i" } else { "" })
            }
            Kernel::QmvMoeGlu { lanes, pairs, n4 } => {
                format!("qmv_moe_glu_q4_l{lanes}_p{pairs}{}", if n4 > 0 { "_i" } else { "" })
            }
            Kernel::Embed(f) => format!("embed_{}", f.name()),
            Kernel::RmsNorm { .. } => "rmsnorm".into(),
            Kernel::RmsNormRows { wg, sums, parts, .. } => {
                format!("rmsnorm_rows{wg}{}{}", if sums { "_sums" } else { "" }, if parts { "_parts" } else { "" })
            }
            Kernel::HeadNormRope { wg } => format!("head_norm_rope{}", wg_label(wg)),
            Kernel::QkvNormRope { wg } => format!("qkv_norm_rope{}", wg_label(wg)),
            Kernel::Attention { dv } => format!("attention_d{dv}"),
            Kernel::AttentionCoop { d, sums } => format!("attention_coop_d{d}{}", if sums { "_sums" } else { "" }),
            Kernel::AttentionSplit { dk, qnorm } => {
                format!("attention_split_d{dk}{}", if qnorm { "_qnorm" } else { "" })
            }
            Kernel::AttentionCombine => "attention_combine".into(),
            Kernel::AttentionShort { d4, qnorm, .. } => {
                format!("attention_short_d{}{}", 4 * d4, if qnorm { "_qnorm" } else { "" })
            }
            Kernel::GeluMul => "gelu_mul".into(),
            Kernel::GeluMulSums => "gelu_mul_sums".into(),
            Kernel::SoftcapArgmax => "softcap_argmax".into(),
            Kernel::ArgmaxMerge => "argmax_merge".into(),
            Kernel::DraftSelect => "draft_select".into(),
            Kernel::DraftScore(f) => format!("draft_score_{}", f.name()),
            Kernel::DraftPick => "draft_pick".into(),
            Kernel::SpecAccept => "spec_accept".into(),
            Kernel::SpecRows => "spec_rows".into(),
            Kernel::RouterTopk => "router_topk".into(),
            Kernel::MoeMatmul(f) => format!("moe_matmul_{}", f.name()),
            Kernel::MoeGroup => "moe_group".into(),
            Kernel::MoeMatmulGrouped(f) => format!("moe_matmul_grouped_{}", f.name()),
            Kernel::QmmMoe => "qmm_moe_q4".into(),
            Kernel::MoeCombine => "moe_combine".into(),
            Kernel::MoeNorm { .. } => "moe_norm".into(),
            Kernel::Copy => "copy".into(),
            Kernel::StreamRead { vpt } => format!("stream_read_v{vpt}"),
            Kernel::GridBarrier { atomic } => {
                if atomic {
                    "grid_barrier_atomic".into()
                } else {
                    "grid_barrier".into()
                }
            }
            Kernel::LastWorkgroup { atomic } => {
                if atomic {
                    "last_workgroup_atomic".into()
                } else {
                    "last_workgroup".into()
                }
            }
            Kernel::PersistentChain { xcap, pf, wg } => format!("persistent_chain_x{xcap}_pf{pf}_wg{wg}"),
        }
    }

    /// The same mat-vec over a token tile of `tok` (the 4-bit decode / verify forms, whose
    /// grid x, bindings and per-token arithmetic do not depend on their tile: a row's sum
    /// depends only on its lanes and columns), or `None` for kernels whose tile shapes more.
    pub fn with_tok(self, tok: u32) -> Option<Kernel> {
        match self {
            Kernel::Qmv { lanes, rpt, pro, digits, .. } => Some(Kernel::Qmv { tok, lanes, rpt, pro, digits }),
            Kernel::QmvGlu { lanes, pairs, pro, digits, .. } => Some(Kernel::QmvGlu { tok, lanes, pairs, pro, digits }),
            Kernel::QmvGeluB { lanes, rpt, pro, digits, .. } => Some(Kernel::QmvGeluB { tok, lanes, rpt, pro, digits }),
            _ => None,
        }
    }

    /// The kernel's bindings, in binding-index order. Explicit because auto-derived layouts drop
    /// bindings a variant never reads (the float formats ignore scales and biases).
    pub fn bindings(self) -> &'static [Bind] {
        use Bind::*;
        match self {
            Kernel::Qmv { pro: 1.., .. } | Kernel::QmvGlu { pro: 1.., .. } => {
                &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read, Read, ReadWrite, Uniform]
            }
            Kernel::QmvGeluB { pro: 1.., .. } => {
                &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read, Read, Read, ReadWrite, Uniform]
            }
            Kernel::Matmul(..) | Kernel::Qmv { .. } | Kernel::QmvGlu { .. } | Kernel::Qmm { .. } | Kernel::Embed(_) => {
                &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform]
            }
            Kernel::QmmCoop { .. } => &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read],
            // ysum (8): the GeGLU's sums over 64-row groups, the down projection's x sums.
            Kernel::QmmCoopGlu { .. } => &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read, ReadWrite],
            // xsum (9): the chunk forms'; part (10): the split-k partials the rows form over
            // partials reads. The decode form declares neither: one layout serves every form
            // (decode and verify steps bind the chunk form's bind group).
            Kernel::RmsNorm { .. } | Kernel::RmsNormRows { .. } => {
                &[Read, Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite, Uniform, Uniform, Read, ReadWrite, Read]
            }
            Kernel::QmvGeluB { .. } => &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read],
            Kernel::QmmSum | Kernel::GroupSum => &[Read, ReadWrite, Uniform, Uniform],
            Kernel::AttentionSplit { qnorm: true, .. } | Kernel::AttentionShort { qnorm: true, .. } => {
                &[Read, Read, Read, ReadWrite, Uniform, Uniform, Read, Read, Uniform]
            }
            Kernel::HeadNormRope { .. }
            | Kernel::Attention { .. }
            | Kernel::AttentionSplit { .. }
            | Kernel::AttentionShort { .. } => &[Read, Read, Read, ReadWrite, Uniform, Uniform],
            Kernel::AttentionCoop { sums: false, .. } => &[Read, Read, Read, ReadWrite, Uniform, Uniform],
            // osum (6): the output's sums over each 64-dim value stage, the o projection's x sums.
            Kernel::AttentionCoop { sums: true, .. } => &[Read, Read, Read, ReadWrite, Uniform, Uniform, ReadWrite],
            Kernel::QkvNormRope { .. } => &[Read, Read, Read, ReadWrite, ReadWrite, ReadWrite, Uniform, Uniform],
            Kernel::AttentionCombine | Kernel::Copy | Kernel::StreamRead { .. } => &[Read, ReadWrite, Uniform, Uniform],
            Kernel::GridBarrier { .. } | Kernel::LastWorkgroup { .. } => {
                &[ReadWrite, ReadWrite, ReadWrite, Uniform, Uniform]
            }
            Kernel::PersistentChain { .. } => &[Read, Read, ReadWrite, ReadWrite, Uniform, Uniform],
            Kernel::GeluMul => &[ReadWrite, Read, Uniform, Uniform],
            Kernel::GeluMulSums => &[ReadWrite, Read, Uniform, Uniform, ReadWrite, Read],
            Kernel::SoftcapArgmax | Kernel::ArgmaxMerge => &[ReadWrite, ReadWrite, ReadWrite, Uniform, Uniform],
            Kernel::DraftSelect | Kernel::DraftPick => &[Read, Read, ReadWrite, Uniform, Uniform],
            Kernel::DraftScore(_) => &[Read, Read, Read, Read, Read, ReadWrite, Uniform, Uniform],
            Kernel::SpecAccept => &[Read, Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite, Uniform, Uniform],
            Kernel::SpecRows => &[Read, ReadWrite, Read, Uniform, Uniform],
            Kernel::RouterTopk => &[Read, Read, ReadWrite, ReadWrite, Uniform, Uniform],
            Kernel::MoeMatmul(_)
            | Kernel::MoeMatmulGrouped(_)
            | Kernel::QmmMoe
            | Kernel::QmvMoe { .. }
            | Kernel::QmvMoeGlu { .. } => &[Read, Read, Read, Read, Read, ReadWrite, Uniform, Uniform],
            Kernel::QmmCoopMoe { .. } => &[Read, Read, Read, Read, Read, ReadWrite, Uniform, Uniform, Read],
            Kernel::MoeGroup => &[Read, ReadWrite, Uniform, Uniform],
            Kernel::MoeCombine => &[Read, Read, ReadWrite, Uniform, Uniform],
            Kernel::MoeNorm { .. } => &[Read, Read, Read, Read, ReadWrite, Uniform, Uniform],
        }
    }
}

/// The label suffix of a fused-norm variant (`_norm1536`, `_norm1536i` with integer digits),
/// none for the plain one.
fn pro_label(pro: u32, digits: bool) -> String {
    if pro == 0 {
        String::new()
    } else {
        format!("_norm{}{}", 4 * pro, if digits { "i" } else { "" })
    }
}

/// A label's suffix for the head norms on fewer threads than [`HEAD_NORM_WG`] (the default for
/// heads up to 512 wide is 128: `_wg128`).
fn wg_label(wg: u32) -> String {
    if wg == HEAD_NORM_WG {
        String::new()
    } else {
        format!("_wg{wg}")
    }
}
