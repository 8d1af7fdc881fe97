//! WGSL sources, the Rust mirrors of their params structs, and the pipeline cache.
//!
//! The generic weight-reading kernels (`matmul`, `embed`, `moe_matmul*`) are written once
//! against a `load8` function; the weight format (`wgsl/formats/{q4,q8,bf16,f32}.wgsl`) is
//! prepended at pipeline creation, and the pipeline is named `<kernel>_<format>` (the label
//! validation errors quote). 4-bit weights, the format that matters for speed, have their own
//! kernels of the same bindings: `qmv` (decode/verify mat-vec), `qmv_moe` (routed experts) and
//! `qmm` (prefill mat-mat), with tile constants substituted and `// @unroll` blocks expanded
//! here ([`unroll`]); the label carries the tile (`qmv_q4_t1_l32_r4`).
//! Every params struct here has a WGSL struct of the same name and field order.

use std::collections::HashMap;

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};

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
    fn source(self) -> &'static str {
        match self {
            Format::Q4 => concat!(
                include_str!("../../../wgsl/formats/groups.wgsl"),
                include_str!("../../../wgsl/formats/q4.wgsl")
            ),
            Format::Q8 => concat!(
                include_str!("../../../wgsl/formats/groups.wgsl"),
                include_str!("../../../wgsl/formats/q8.wgsl")
            ),
            Format::Bf16 => include_str!("../../../wgsl/formats/bf16.wgsl"),
            Format::F32 => include_str!("../../../wgsl/formats/f32.wgsl"),
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
    /// `pro` > 0: the fused-norm form (qmv_norm.wgsl) over rows of 4 · `pro` values.
    Qmv {
        tok: u32,
        lanes: u32,
        rpt: u32,
        pro: u32,
    },
    /// `Qmv` over a stacked [gate; up] matrix with the GeGLU as epilogue (qmv.wgsl's GeGLU
    /// form): `pairs` output rows per team.
    QmvGlu {
        tok: u32,
        lanes: u32,
        pairs: u32,
        pro: u32,
    },
    /// `Qmv` with the gated epilogue `gelu_tanh(y) · gb[..]` (qmv.wgsl's gated form).
    QmvGeluB {
        tok: u32,
        lanes: u32,
        rpt: u32,
        pro: u32,
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
    /// chunks' with `KESTREL_NORM_ROWS=0`).
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
        sum_group0: bool,
    },
    GeluMul,
    /// gelu_mul that also writes each token's sums of its output over groups of 64 (chunks).
    GeluMulSums,
    /// Softcap and each chunk's first maximum (pass 1 of the argmax).
    SoftcapArgmax,
    /// Each row's first maximum among its chunks' (pass 2).
    ArgmaxMerge,
    /// MoE: softmax, top-k and weights of the router logits; `staged`: the chosen experts'
    /// logits and scales from workgroup memory ([`router_staged`]).
    RouterTopk {
        staged: bool,
    },
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

impl Kernel {
    pub fn label(self) -> String {
        match self {
            Kernel::Matmul(f, tok) => format!("matmul_{}_t{tok}", f.name()),
            Kernel::Qmv { tok, lanes, rpt, pro } => format!("qmv_q4_t{tok}_l{lanes}_r{rpt}{}", pro_label(pro)),
            Kernel::QmvGlu { tok, lanes, pairs, pro } => {
                format!("qmv_glu_q4_t{tok}_l{lanes}_p{pairs}{}", pro_label(pro))
            }
            Kernel::QmvGeluB { tok, lanes, rpt, pro } => {
                format!("qmv_gelu_b_q4_t{tok}_l{lanes}_r{rpt}{}", pro_label(pro))
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
            Kernel::AttentionShort { d4, qnorm, sum_group0, .. } => format!(
                "attention_short_d{}{}{}",
                4 * d4,
                if qnorm { "_qnorm" } else { "" },
                if sum_group0 { "_g0" } else { "" }
            ),
            Kernel::GeluMul => "gelu_mul".into(),
            Kernel::GeluMulSums => "gelu_mul_sums".into(),
            Kernel::SoftcapArgmax => "softcap_argmax".into(),
            Kernel::ArgmaxMerge => "argmax_merge".into(),
            Kernel::RouterTopk { staged } => {
                if staged {
                    "router_topk_staged".into()
                } else {
                    "router_topk".into()
                }
            }
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

    /// The WGSL of this kernel: the shared prelude (`common.wgsl`), then for weight-reading
    /// kernels the format's `load8`/`load1` or the 4-bit helpers, for decode attention the
    /// shared softmax step, then the kernel (with its shared loop: qmv_core, qmm_core).
    /// `sg`: the subgroup size reductions may use (0: none; workgroup-memory trees instead).
    fn source(self, sg: u32) -> String {
        // Enable directives must open the module.
        let coop = matches!(
            self,
            Kernel::QmmCoop { .. }
                | Kernel::QmmCoopMoe { .. }
                | Kernel::QmmCoopGlu { .. }
                | Kernel::AttentionCoop { .. }
        );
        // Tensor-core kernels also share their operands' f16 split (halves.wgsl).
        let enables = if coop {
            concat!("enable f16;\nenable wgpu_cooperative_matrix;\n", include_str!("../../../wgsl/halves.wgsl"))
        } else {
            ""
        };
        format!("{enables}{}\n{}", include_str!("../../../wgsl/common.wgsl"), self.body(sg))
    }

    fn body(self, sg: u32) -> String {
        let tile = include_str!("../../../wgsl/attention_tile.wgsl");
        let params = include_str!("../../../wgsl/attention_params.wgsl");
        let moe_params = include_str!("../../../wgsl/moe_params.wgsl");
        let matmul_params = include_str!("../../../wgsl/matmul_params.wgsl");
        let groups = include_str!("../../../wgsl/formats/groups.wgsl");
        let argmax_params = include_str!("../../../wgsl/argmax_params.wgsl");
        let norm_params = include_str!("../../../wgsl/norm_params.wgsl");
        let argmax_tree = include_str!("../../../wgsl/argmax_tree.wgsl");
        match self {
            Kernel::Matmul(f, tok) => {
                let src = include_str!("../../../wgsl/matmul.wgsl");
                let src = src.replace("{{TOK}}", &tok.to_string()).replace("{{ROWS}}", &matmul_rows(tok).to_string());
                format!("{}\n{matmul_params}\n{src}", f.source())
            }
            Kernel::Qmv { tok, lanes, rpt, pro } => {
                format!("{matmul_params}\n{}", qmv_source(&qmv_kernel(pro, 7, sg), tok, lanes, rpt, 0, sg, pro == 0))
            }
            Kernel::QmvGeluB { tok, lanes, rpt, pro } => {
                let kernel = qmv_kernel(pro, 8, sg)
                    .replace("// {{GB_BINDING}}", "@group(0) @binding(7) var<storage, read> gb: array<f32>;");
                format!(
                    "{}\n{}",
                    include_str!("../../../wgsl/matmul_gb_params.wgsl"),
                    qmv_source(&kernel, tok, lanes, rpt, QMV_GELU_B, sg, pro == 0)
                )
            }
            Kernel::QmvGlu { tok, lanes, pairs, pro } => format!(
                "{matmul_params}\n{}",
                qmv_source(&qmv_kernel(pro, 7, sg), tok, lanes, 2 * pairs, pairs, sg, pro == 0)
            ),
            Kernel::QmvMoe { lanes, rpt, n4 } => {
                format!("{moe_params}\n{}", qmv_source(&qmv_moe_kernel(n4), 1, lanes, rpt, 0, sg, false))
            }
            Kernel::QmvMoeGlu { lanes, pairs, n4 } => {
                format!("{moe_params}\n{}", qmv_source(&qmv_moe_kernel(n4), 1, lanes, 2 * pairs, pairs, sg, false))
            }
            Kernel::Qmm { tm } => {
                format!("{matmul_params}\n{groups}\n{}", qmm_source(include_str!("../../../wgsl/qmm.wgsl"), tm))
            }
            Kernel::QmmMoe => format!(
                "{moe_params}\n{groups}\n{}",
                qmm_source(include_str!("../../../wgsl/qmm_moe.wgsl"), QMM_MOE_TM)
            ),
            Kernel::QmmCoop { tb, rb } => format!(
                "{matmul_params}\n{groups}\n{}",
                qmm_coop_source(include_str!("../../../wgsl/qmm_coop.wgsl"), tb, rb, false, qmm_bias_prefetch(true))
            ),
            Kernel::QmmCoopMoe { tb, rb } => format!(
                "{moe_params}\n{groups}\n{}",
                qmm_coop_source(
                    include_str!("../../../wgsl/qmm_coop_moe.wgsl"),
                    tb,
                    rb,
                    false,
                    qmm_bias_prefetch(false)
                )
            ),
            Kernel::QmmCoopGlu { tb } => {
                let gelu = include_str!("../../../wgsl/gelu.wgsl");
                format!(
                    "{matmul_params}\n{gelu}\n{groups}\n{}",
                    qmm_coop_source(
                        include_str!("../../../wgsl/qmm_coop_glu.wgsl"),
                        tb,
                        4,
                        true,
                        qmm_bias_prefetch(false)
                    )
                )
            }
            Kernel::QmmSum => format!("{matmul_params}\n{}", include_str!("../../../wgsl/qmm_sum.wgsl")),
            Kernel::GroupSum => include_str!("../../../wgsl/group_sum.wgsl").to_string(),
            Kernel::Embed(f) => format!("{}\n{}", f.source(), include_str!("../../../wgsl/embed.wgsl")),
            Kernel::RmsNorm { v, wg } => {
                let src = subgroup_text(include_str!("../../../wgsl/rmsnorm.wgsl"), sg)
                    .replace("{{V}}", &v.to_string())
                    .replace("{{WG}}", &wg.to_string());
                format!("{norm_params}\n{}", unroll(&src, &[("V", v)]))
            }
            Kernel::RmsNormRows { v4, wg, sums, parts } => {
                // Subgroup sums need subgroups no wider than the workgroup.
                let sg = if sg > wg { 0 } else { sg };
                let src = subgroup_text(include_str!("../../../wgsl/rmsnorm_rows.wgsl"), sg)
                    .replace("{{V4}}", &v4.to_string())
                    .replace("{{WG}}", &wg.to_string());
                format!(
                    "{norm_params}\n{}",
                    unroll(
                        &src,
                        &[
                            ("V4", v4),
                            ("SUMS", u32::from(sums)),
                            ("PARTS", u32::from(parts)),
                            ("NOPARTS", u32::from(!parts))
                        ]
                    )
                )
            }
            Kernel::HeadNormRope { wg } | Kernel::QkvNormRope { wg } => {
                let kernel = if matches!(self, Kernel::HeadNormRope { .. }) {
                    include_str!("../../../wgsl/head_norm_rope.wgsl")
                } else {
                    include_str!("../../../wgsl/qkv_norm_rope.wgsl")
                };
                unroll(
                    &format!("{kernel}\n{}", include_str!("../../../wgsl/head_norm_core.wgsl"))
                        .replace("{{WG}}", &wg.to_string()),
                    &[],
                )
            }
            Kernel::Attention { dv } => {
                let dw = dv.div_ceil(4);
                let src = include_str!("../../../wgsl/attention.wgsl")
                    .replace("{{DV}}", &dv.to_string())
                    .replace("{{DW}}", &dw.to_string());
                format!("{params}\n{}", unroll(&src, &[("DV", dv), ("DW", dw)]))
            }
            Kernel::AttentionCoop { d, sums } => {
                let src = include_str!("../../../wgsl/attention_coop.wgsl").replace("{{D}}", &d.to_string());
                format!(
                    "{params}\n{}",
                    unroll(&src, &[("NC", d / 64), ("PLAIN", u32::from(!sums)), ("SUMS", u32::from(sums))])
                )
            }
            Kernel::AttentionSplit { dk, qnorm } => {
                // A/B knobs for measurements: KESTREL_ATTN_G (keys in flight), KESTREL_ATTN_TREE=1
                // (the workgroup-memory tree where the device has subgroups). Subgroup sums need
                // subgroups no wider than the kernel's 64 threads.
                let g =
                    std::env::var("KESTREL_ATTN_G").ok().and_then(|v| v.parse().ok()).unwrap_or(ATTN_KEYS_IN_FLIGHT);
                let sg =
                    if std::env::var("KESTREL_ATTN_TREE").as_deref() == Ok("1") || sg > ATTN_SPLIT_WG { 0 } else { sg };
                let (partial, sum) = if sg > 0 {
                    (
                        include_str!("../../../wgsl/attention_key_subgroup.wgsl"),
                        include_str!("../../../wgsl/attention_key_subgroup_sum.wgsl"),
                    )
                } else {
                    (
                        include_str!("../../../wgsl/attention_key_tree.wgsl"),
                        include_str!("../../../wgsl/attention_key_tree_sum.wgsl"),
                    )
                };
                let src = include_str!("../../../wgsl/attention_split.wgsl")
                    .replace("// {{KEY_PARTIAL}}", partial)
                    .replace("// {{KEY_SUM}}", sum)
                    .replace("{{SG}}", &sg.max(1).to_string())
                    .replace("{{DK}}", &dk.to_string())
                    .replace("{{G}}", &g.to_string());
                let (load, qnorm_src) = if qnorm {
                    ("load_query_normed", include_str!("../../../wgsl/attention_qnorm.wgsl"))
                } else {
                    ("load_query", "")
                };
                let src = format!("{}\n{qnorm_src}", src.replace("{{LOAD_QUERY}}", load));
                format!("{params}\n{}\n{tile}", unroll(&src, &[("DK", dk), ("G", g)]))
            }
            Kernel::AttentionShort { d4, wg, qnorm, sum_group0 } => {
                let s = short_shape(d4, wg);
                let team = if sg >= s.tpk {
                    include_str!("../../../wgsl/attention_team_subgroup.wgsl")
                } else {
                    include_str!("../../../wgsl/attention_team_tree.wgsl")
                };
                // workgroup_sum / workgroup_max over subgroups need subgroups no wider than WG.
                let src = subgroup_text(
                    &include_str!("../../../wgsl/attention_short.wgsl").replace("// {{TEAM_SUM}}", team),
                    if sg > wg { 0 } else { sg },
                );
                let (load, qnorm_src) = if qnorm {
                    ("load_query_normed", include_str!("../../../wgsl/attention_qnorm.wgsl"))
                } else {
                    ("load_query", "")
                };
                let dk = (4 * d4).div_ceil(wg);
                let src = format!("{}\n{qnorm_src}", src.replace("{{LOAD_QUERY}}", load))
                    .replace("{{WG}}", &wg.to_string())
                    .replace("{{TPK}}", &s.tpk.to_string())
                    .replace("{{VPL}}", &s.vpl.to_string())
                    .replace("{{G}}", &s.g.to_string())
                    .replace("{{TV}}", &s.tv.to_string())
                    .replace("{{GV}}", &s.gv.to_string())
                    .replace("{{DK}}", &dk.to_string())
                    .replace("{{SUM_GROUP0}}", if sum_group0 { "true" } else { "false" })
                    .replace("{{VH}}", &short_vh_vec4s(wg, s.tv, sum_group0).to_string());
                format!("{params}\n{}", unroll(&src, &[("VPL", s.vpl), ("G", s.g), ("GV", s.gv), ("DK", dk)]))
            }
            Kernel::AttentionCombine => {
                let src = include_str!("../../../wgsl/attention_combine.wgsl").replace("{{U}}", &COMBINE_U.to_string());
                format!("{params}\n{}", unroll(&src, &[("U", COMBINE_U)]))
            }
            Kernel::GeluMul | Kernel::GeluMulSums => {
                let sums = self == Kernel::GeluMulSums;
                let src = subgroup_text(include_str!("../../../wgsl/gelu_mul.wgsl"), sg);
                format!(
                    "{}\n{}",
                    include_str!("../../../wgsl/gelu.wgsl"),
                    unroll(&src, &[("PLAIN", u32::from(!sums)), ("SUMS", u32::from(sums))])
                )
            }
            Kernel::SoftcapArgmax => {
                let src = include_str!("../../../wgsl/softcap_argmax.wgsl").replace("{{U}}", &ARGMAX_U.to_string());
                format!("{argmax_params}\n{argmax_tree}\n{}", unroll(&src, &[("U", ARGMAX_U)]))
            }
            Kernel::ArgmaxMerge => {
                format!("{argmax_params}\n{argmax_tree}\n{}", include_str!("../../../wgsl/argmax_merge.wgsl"))
            }
            Kernel::RouterTopk { staged } => include_str!("../../../wgsl/router_topk.wgsl")
                .replace("{{WG}}", &ROUTER_TOPK_WG.to_string())
                .replace("{{STAGED}}", if staged { "true" } else { "false" }),
            Kernel::MoeMatmul(f) => {
                format!("{}\n{moe_params}\n{}", f.source(), include_str!("../../../wgsl/moe_matmul.wgsl"))
            }
            Kernel::MoeGroup => include_str!("../../../wgsl/moe_group.wgsl").into(),
            Kernel::MoeMatmulGrouped(f) => {
                format!("{}\n{moe_params}\n{}", f.source(), include_str!("../../../wgsl/moe_matmul_grouped.wgsl"))
            }
            Kernel::MoeCombine => include_str!("../../../wgsl/moe_combine.wgsl").into(),
            Kernel::MoeNorm { v, wg, k } => {
                let src = subgroup_text(include_str!("../../../wgsl/moe_norm.wgsl"), sg)
                    .replace("{{V}}", &v.to_string())
                    .replace("{{WG}}", &wg.to_string())
                    .replace("{{K}}", &k.to_string());
                unroll(&src, &[("V", v), ("K", k)])
            }
            Kernel::Copy => format!(
                "{}\n{}",
                include_str!("../../../wgsl/copy_bindings.wgsl"),
                include_str!("../../../wgsl/copy.wgsl")
            ),
            Kernel::StreamRead { vpt } => {
                let src = include_str!("../../../wgsl/stream_read.wgsl").replace("{{VPT}}", &vpt.to_string());
                format!("{}\n{}", include_str!("../../../wgsl/copy_bindings.wgsl"), unroll(&src, &[("VPT", vpt)]))
            }
            Kernel::GridBarrier { atomic } => handed_over(include_str!("../../../wgsl/grid_barrier.wgsl"), atomic),
            Kernel::LastWorkgroup { atomic } => handed_over(include_str!("../../../wgsl/last_workgroup.wgsl"), atomic),
            Kernel::PersistentChain { xcap, pf, wg } => include_str!("../../../wgsl/persistent_chain.wgsl")
                .replace("{{XCAP4}}", &(xcap / 4).to_string())
                .replace("{{PF}}", &pf.to_string())
                .replace("{{WG}}", &wg.to_string())
                .replace("{{MAX_STAGES}}", &MAX_CHAIN_STAGES.to_string()),
        }
    }
}

/// A probe kernel (grid_barrier, last_workgroup) after barrier_params.wgsl, with the values its
/// workgroups hand each other (`slots`: `{{SLOTS}}` its type, `{{PUT}}` / `{{GET}}` the store
/// and load of `v` at `i`) as plain u32s or, `atomic`, as atomics.
fn handed_over(src: &str, atomic: bool) -> String {
    let (ty, put, get) = if atomic {
        ("array<atomic<u32>>", "atomicStore(&slots[i], v);", "atomicLoad(&slots[i])")
    } else {
        ("array<u32>", "slots[i] = v;", "slots[i]")
    };
    let src = src.replace("{{SLOTS}}", ty).replace("{{PUT}}", put).replace("{{GET}}", get);
    format!("{}\n{src}", include_str!("../../../wgsl/barrier_params.wgsl"))
}

/// `src` with its reductions for subgroups of `sg` lanes (0: none): the workgroup sum
/// (`// {{WORKGROUP_SUM}}`: reduce_subgroup.wgsl or reduce_tree.wgsl), qmv_reduce's butterfly
/// (`// {{BUTTERFLY}}`: qmv_butterfly.wgsl, or nothing) and `{{SG}}` (1 without subgroups).
/// Before `unroll`: the butterfly has `@unroll` blocks.
fn subgroup_text(src: &str, sg: u32) -> String {
    let (reduce, butterfly) = if sg > 0 {
        (include_str!("../../../wgsl/reduce_subgroup.wgsl"), include_str!("../../../wgsl/qmv_butterfly.wgsl"))
    } else {
        (include_str!("../../../wgsl/reduce_tree.wgsl"), "")
    };
    src.replace("// {{WORKGROUP_SUM}}", reduce)
        .replace("// {{BUTTERFLY}}", butterfly)
        .replace("{{SG}}", &sg.max(1).to_string())
}

/// A qmm kernel (`qmm.wgsl`, `qmm_moe.wgsl`) followed by the shared tile loop (`qmm_core.wgsl`),
/// TM substituted and the `@unroll` blocks expanded.
fn qmm_source(kernel: &str, tm: u32) -> String {
    let src = format!("{kernel}\n{}", include_str!("../../../wgsl/qmm_core.wgsl")).replace("{{TM}}", &tm.to_string());
    unroll(&src, &[("TM", tm), ("TN", 4), ("WPT", tm / 4)])
}

/// A tensor-core mat-mat kernel with qmm_coop_core.wgsl's tile of 32 · `rb` rows × 64 · `tb`
/// tokens, and its GeGLU epilogue when `glu`; its bias steps' operands loaded a step ahead
/// (BIAS_PF in qmm_coop_core.wgsl) when `bias_pf`.
fn qmm_coop_source(kernel: &str, tb: u32, rb: u32, glu: bool, bias_pf: bool) -> String {
    let src = format!("{kernel}\n{}", include_str!("../../../wgsl/qmm_coop_core.wgsl"))
        .replace("{{TB}}", &tb.to_string())
        .replace("{{RB}}", &rb.to_string())
        .replace("{{BIAS_PF}}", if bias_pf { "true" } else { "false" });
    unroll(
        &src,
        &[
            ("TB", tb),
            ("RB", rb),
            ("WPT", rb / 2),
            ("XPT", 2 * tb),
            ("PLAIN", u32::from(!glu)),
            ("GLU", u32::from(glu)),
        ],
    )
}

/// Whether a tensor-core mat-mat loads its bias steps' operands a step ahead, the first step's
/// before its k loop (BIAS_PF in qmm_coop_core.wgsl: the same arithmetic, so the same bits):
/// the `dense` form (qmm_coop) only. Measured on the H200 (PERF_NOTES.md, session 19 #1): dense
/// E4B chunks 59.74 / 59.74 → 59.41 / 59.52 ms (its dense mat-mats 26.66 → 26.41 ms), 26B's and
/// E2B's even; loaded ahead in the GeGLU and routed-expert forms as well, E4B's GeGLU mat-mats
/// took 23.70 → 24.02 ms and 26B's routed ones 51.1 → 52.4. `KESTREL_QMM_BIAS_PF`: 0 in no
/// form, all in every form (A/B knobs).
fn qmm_bias_prefetch(dense: bool) -> bool {
    match std::env::var("KESTREL_QMM_BIAS_PF").as_deref() {
        Ok("0") => false,
        Ok("all") => true,
        _ => dense,
    }
}

/// The prefill kernel of 4-bit routed experts, its rows and its pairs per workgroup: `qmm_moe`,
/// or with `coop` (as [`qmm_shape`]) `qmm_coop_moe` with 64-pair tiles (a 512-token chunk gives
/// the 26B's 128 experts 32 pairs each on average: a 128-pair tile would be three quarters
/// duplicates).
pub fn qmm_moe_shape(coop: bool) -> (Kernel, u32, u32) {
    if coop {
        (Kernel::QmmCoopMoe { tb: 1, rb: 4 }, 128, 64)
    } else {
        (Kernel::QmmMoe, 16 * QMM_MOE_TM, QMM_TOK)
    }
}

/// Rows per thread of `qmm_moe` (TM of qmm_core.wgsl): qmm's rule.
pub const QMM_MOE_TM: u32 = 4;

/// Bytes of x one round of the staged qmv may hold in workgroup memory (with `red`, within the
/// 32 KiB of lavapipe and the 48 KiB of the H200).
const QMV_STAGE_BYTES: u32 = 16384;

/// Whether a qmv tile may stage x in workgroup memory (qmv_core.wgsl's `qmv_dots_staged`, taken
/// for rows of more than two chunks per lane): where four or more teams share a workgroup (each
/// would read x itself) and a round of x fits [`QMV_STAGE_BYTES`] — for lanes ≤ 32 always, at
/// decode's CU 2 and verify's 4 tokens, so the decode and verify tiles of a matrix take the same
/// loop (their rows are bitwise equal: tested).
fn qmv_staged(tok: u32, lanes: u32, cu: u32) -> bool {
    lanes <= QMV_STAGE_LANES && tok * lanes * cu * 32 * 4 <= QMV_STAGE_BYTES
}

/// The widest team that stages x: at 64 lanes (two teams) a round's 16 KiB of x and its barriers
/// cost more than the halved x reads save (E4B gate|up 25.0 → 33.8 µs staged; session 6 sweep).
const QMV_STAGE_LANES: u32 = 32;

/// `pairs` value of `qmv_source` that picks qmv.wgsl's gated form.
const QMV_GELU_B: u32 = u32::MAX;

/// qmv.wgsl, with x read from its binding, or (`pro` > 0) with qmv_norm.wgsl's fused-norm
/// prologue over rows of 4 · `pro` values, its bindings from index `first`.
fn qmv_kernel(pro: u32, first: u32, sg: u32) -> String {
    let src = include_str!("../../../wgsl/qmv.wgsl");
    if pro == 0 {
        return src
            .replace("// {{XLOAD}}", "fn xload(i: u32) -> vec4<f32> { return x[i]; }")
            .replace("{{XROW}}", "(min(t0 + {t}u, count - 1u) * p.x_stride) / 4u")
            .replace("{{DOTS}}", "qmv_dots_wg");
    }
    let digits = qmv_digits();
    let src = src.replace("{{DOTS}}", if digits { "qmv_dots_digits" } else { "qmv_dots_wg" });
    let pro_src = include_str!("../../../wgsl/qmv_norm.wgsl")
        .replace("{{PB}}", &first.to_string())
        .replace("{{PB1}}", &(first + 1).to_string())
        .replace("{{PB2}}", &(first + 2).to_string())
        .replace("{{PB3}}", &(first + 3).to_string())
        .replace("{{KV}}", &pro.div_ceil(QMV_WG).to_string())
        .replace("// @unroll k KV", &format!("// @unroll k {}", pro.div_ceil(QMV_WG)));
    let pro_src = format!("{}\n{}", subgroup_text(&pro_src, sg), digits_source(pro, digits));
    src.replace("// {{XLOAD}}", &pro_src)
        .replace("{{XROW}}", "{t}u * N4")
        .replace("// {{PROLOGUE}}", "qmv_prologue(lid, wid.x + wid.z == 0u, t0, count);")
}

/// qmv_digits.wgsl for x rows of 4 · `n4` values, its loop on (`on`) or not.
fn digits_source(n4: u32, on: bool) -> String {
    include_str!("../../../wgsl/qmv_digits.wgsl")
        .replace("{{N4}}", &n4.to_string())
        .replace("{{DIGITS}}", if on { "true" } else { "false" })
}

/// Whether the fused-norm and routed-expert mat-vecs multiply integer digits of their input
/// (qmv_digits.wgsl: each 32-value chunk turned into dot32i's digits once per workgroup, the
/// loop `qmv_dots_digits`) rather than its floats (`qmv_dots`). On unless `KESTREL_QMV_DIGITS=0`;
/// `=gate` keeps the experts' down projection on floats (A/B knobs; PERF_NOTES.md, session 34).
fn qmv_digits() -> bool {
    std::env::var("KESTREL_QMV_DIGITS").as_deref() != Ok("0")
}

/// The x row length (in vec4s) a routed-expert mat-vec of `cols` and `rpt` rows per team stages
/// as digits, 0 for the float loop: [`qmv_digits`], where the digits (16 bytes per 4 values) and
/// `red` fit [`WG_MEMORY_MIN`], so no device's limit needs asking (the 26B's 2816-wide gate_up
/// rows: 11 KiB + 2 KiB). `glu`: the gate_up form (`KESTREL_QMV_DIGITS=gate` leaves the down
/// projection on floats).
fn qmv_moe_n4(cols: usize, rpt: u32, glu: bool) -> u32 {
    let on = qmv_digits() && (glu || std::env::var("KESTREL_QMV_DIGITS").as_deref() != Ok("gate"));
    let bytes = 4 * cols + 4 * (rpt * QMV_WG) as usize;
    if on && bytes <= WG_MEMORY_MIN {
        (cols / 4) as u32
    } else {
        0
    }
}

/// Workgroup memory every WebGPU device offers (maxComputeWorkgroupStorageSize's minimum).
const WG_MEMORY_MIN: usize = 16384;

/// qmv_moe.wgsl with qmv_digits.wgsl: its loop on for x rows of 4 · `n4` > 0 values; off, the
/// digits' array is a token 8 vec4s the float loop never touches.
fn qmv_moe_kernel(n4: u32) -> String {
    format!("{}\n{}", include_str!("../../../wgsl/qmv_moe.wgsl"), digits_source(n4.max(8), n4 > 0))
}

/// The label suffix of a fused-norm variant (`_norm1536`, `_norm1536i` with integer digits),
/// none for the plain one.
fn pro_label(pro: u32) -> String {
    if pro == 0 {
        String::new()
    } else {
        format!("_norm{}{}", 4 * pro, if qmv_digits() { "i" } else { "" })
    }
}

/// A qmv kernel (`qmv.wgsl`, `qmv_moe.wgsl`) followed by the shared loop (`qmv_core.wgsl`),
/// with the tile constants substituted and the `@unroll` blocks expanded. `pairs` > 0 picks the
/// GeGLU form (`rpt` = 2 · pairs rows of W per team: pairs gate rows, pairs up rows);
/// [`QMV_GELU_B`] the gated form.
fn qmv_source(kernel: &str, tok: u32, lanes: u32, rpt: u32, pairs: u32, sg: u32, stageable: bool) -> String {
    let gelu = include_str!("../../../wgsl/gelu.wgsl");
    let src = format!(
        "{kernel}\n{gelu}\n{}\n{}",
        include_str!("../../../wgsl/formats/groups.wgsl"),
        subgroup_text(include_str!("../../../wgsl/qmv_core.wgsl"), sg)
    );
    // Output rows per team; the plain epilogue's count (0 in the other forms), the GeGLU's and
    // the gated one's.
    let (own, plain, glu, gb) = match pairs {
        QMV_GELU_B => (rpt, 0, 0, rpt),
        0 => (rpt, rpt, 0, 0),
        _ => (pairs, 0, pairs, 0),
    };
    let src = src
        .replace("{{TOK}}", &tok.to_string())
        .replace("{{LANES}}", &lanes.to_string())
        .replace("{{RPT}}", &rpt.to_string())
        .replace("{{OWN}}", &own.to_string());
    // Decode tiles issue two chunks' loads per round; verify tiles (4 tokens' x per chunk) one.
    // KESTREL_QMV_CU overrides it for the kbench sweep (an experiment knob, not a setting).
    let cu = std::env::var("KESTREL_QMV_CU").ok().and_then(|v| v.parse().ok()).unwrap_or(if tok == 1 { 2 } else { 1 });
    // KESTREL_QMV_STAGE=0 turns staging off (an A/B knob for measurements).
    let stage =
        stageable && qmv_staged(tok, lanes, cu) && std::env::var("KESTREL_QMV_STAGE").map_or(true, |v| v != "0");
    let src = src.replace("{{CU}}", &cu.to_string()).replace("{{STAGE}}", if stage { "true" } else { "false" });
    unroll(
        &src,
        &[
            ("RPT", rpt),
            ("TOK", tok),
            ("RPT_TOK", rpt * tok),
            ("OWN", own),
            ("PLAIN", plain),
            ("GLU", glu),
            ("GB", gb),
            ("CU", cu),
        ],
    )
}

/// Expands `// @unroll NAME COUNT` … `// @end NAME` blocks: the lines between are repeated for
/// NAME = 0..COUNT with `{NAME}` replaced by the index (COUNT is a number or one of `counts`).
/// Blocks nest. WGSL has no unrolling directive, and a loop the driver leaves rolled puts the
/// arrays it indexes in local memory; expanded code keeps every value in a register.
pub fn unroll(src: &str, counts: &[(&str, u32)]) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::with_capacity(src.len() * 2);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let Some(rest) = line.trim_start().strip_prefix("// @unroll ") else {
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(count)) = (words.next(), words.next()) else { panic!("malformed unroll line: {line}") };
        let n = counts
            .iter()
            .find(|(k, _)| *k == count)
            .map(|&(_, v)| v)
            .or_else(|| count.parse().ok())
            .unwrap_or_else(|| panic!("unknown unroll count {count}"));
        let end = format!("// @end {name}");
        let close = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == end)
            .unwrap_or_else(|| panic!("unroll {name} without {end}"));
        let body = lines[i + 1..close].join("\n");
        let body = unroll(&body, counts);
        for k in 0..n {
            out.push_str(&body.replace(&format!("{{{name}}}"), &k.to_string()));
        }
        i = close + 1;
    }
    out
}

/// How a kernel binds one resource (the WGSL `var<...>` it declares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bind {
    Read,
    ReadWrite,
    Uniform,
}

impl Kernel {
    /// The same mat-vec over a token tile of `tok` (the 4-bit decode / verify forms, whose
    /// grid x, bindings and per-token arithmetic do not depend on their tile: a row's sum
    /// depends only on its lanes and columns), or `None` for kernels whose tile shapes more.
    pub fn with_tok(self, tok: u32) -> Option<Kernel> {
        match self {
            Kernel::Qmv { lanes, rpt, pro, .. } => Some(Kernel::Qmv { tok, lanes, rpt, pro }),
            Kernel::QmvGlu { lanes, pairs, pro, .. } => Some(Kernel::QmvGlu { tok, lanes, pairs, pro }),
            Kernel::QmvGeluB { lanes, rpt, pro, .. } => Some(Kernel::QmvGeluB { tok, lanes, rpt, pro }),
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
            Kernel::RouterTopk { .. } => &[Read, Read, ReadWrite, ReadWrite, Uniform, Uniform],
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

/// Splits a 1-D workgroup count `x` into `(x', z)` with `x' ≤ max` and `x'·z ≥ x`, for kernels
/// that linearise `wid.x + wid.z · num_workgroups.x` (matmul, embed). WebGPU caps each grid
/// dimension at 65535 workgroups; the E2B LM head alone needs 65536.
pub fn fold_grid(x: u32, max: u32) -> (u32, u32) {
    if x <= max {
        (x, 1)
    } else {
        let z = x.div_ceil(max);
        (x.div_ceil(z), z)
    }
}

/// Rows one `moe_matmul` workgroup covers (`ROWS` in moe_matmul.wgsl), and the token tile of
/// the prefill `matmul` variant (the decode variant has a tile of 1).
pub const MATMUL_ROWS: u32 = 4;
pub const MATMUL_TOK: u32 = 8;
/// The token tile of the speculative-verify `matmul` variant (M = k + 1 ≤ 5 typically).
pub const MATMUL_VERIFY_TOK: u32 = 4;

/// Rows one `matmul` workgroup covers for a token tile of `tok` (`ROWS` in matmul.wgsl): one
/// row per workgroup for the decode mat-vec and the verify tile (most workgroups; measured
/// fastest on the H200, see PERF_NOTES.md), four when 8 prefill tokens share each weight load.
pub const fn matmul_rows(tok: u32) -> u32 {
    if tok == 1 || tok == MATMUL_VERIFY_TOK {
        1
    } else {
        4
    }
}
/// The `qmv_moe` variant for 4-bit experts of `rows` rows (per expert) × `cols`, routed
/// `top_k` per token, and its rows per workgroup; `None` where it does not apply (as
/// [`qmv_shape`], with both x strides in whole vec4s). Shaped by the general qmv rule for the
/// `rows · top_k` rows one token's pairs cover (never the LM-head rule: experts are narrow).
pub fn qmv_moe_shape(
    rows: usize,
    cols: usize,
    top_k: usize,
    x_tok_stride: usize,
    x_slot_stride: usize,
) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_tok_stride.is_multiple_of(4) || !x_slot_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_tile_override(rows * top_k, cols).unwrap_or_else(|| qmv_tile(rows * top_k, cols));
    Some((Kernel::QmvMoe { lanes, rpt, n4: qmv_moe_n4(cols, rpt, false) }, QMV_WG / lanes * rpt))
}

/// The `qmv_moe_glu` variant for fused gate_up experts of `rows` gate (and `rows` up) rows ×
/// `cols`, and its output rows per workgroup; `None` where qmv_moe does not apply. Shaped by the
/// qmv rule for the `2 · rows · top_k` rows one token's pairs cover, at least one pair per team.
pub fn qmv_moe_glu_shape(
    rows: usize,
    cols: usize,
    top_k: usize,
    x_tok_stride: usize,
    x_slot_stride: usize,
) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_tok_stride.is_multiple_of(4) || !x_slot_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_tile_override(2 * rows * top_k, cols).unwrap_or_else(|| qmv_tile(2 * rows * top_k, cols));
    let pairs = (rpt / 2).max(1);
    Some((Kernel::QmvMoeGlu { lanes, pairs, n4: qmv_moe_n4(cols, 2 * pairs, true) }, QMV_WG / lanes * pairs))
}

/// Tokens of one `qmm` workgroup (`BN` in qmm.wgsl).
pub const QMM_TOK: u32 = 64;

/// The `qmm` variant for a matrix of `rows` rows, and its rows per workgroup (16 · TM). 4 rows
/// per thread everywhere: on the H200 the 128-row tile (TM 8: 128 multiply-adds per 12
/// workgroup-memory reads instead of 64 per 8) was no faster on any Gemma 4 shape and slower on
/// most (PERF_NOTES.md, session 5; a sweep taken before the harness warmed the GPU's clock, to
/// be re-measured — TM 8 stays a kernel variant, in kbench and the tests, for that).
/// `coop`: the device runs f16 cooperative matrices ([`super::context::Gpu::coop_f16`]) and the
/// caller wants them: then `qmm_coop` (tensor cores; PERF_NOTES.md, session 9). Returns the
/// kernel, its rows and its tokens per workgroup.
pub fn qmm_shape(_rows: usize, coop: bool) -> (Kernel, u32, u32) {
    if !coop {
        return (Kernel::Qmm { tm: 4 }, 64, QMM_TOK);
    }
    // 128 rows × 128 tokens: each weight's dequantisation and each x value's split serve twice
    // the products of 64 × 64 (E4B pp512 4156 → 6313 tok/s, PERF_NOTES.md, session 9).
    // KESTREL_QMM_COOP_TILE=TBxRB picks another tile (an experiment knob for the sweep; TB 1 or
    // 2, RB 2 or 4: what qmm_coop_core.wgsl's staging divides evenly).
    let knob = std::env::var("KESTREL_QMM_COOP_TILE").ok();
    let parsed =
        knob.as_deref().and_then(|v| v.split_once('x')).and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    let (tb, rb) = parsed.filter(|&(tb, rb)| matches!(tb, 1 | 2) && matches!(rb, 2 | 4)).unwrap_or((2, 4));
    (Kernel::QmmCoop { tb, rb }, 32 * rb, 64 * tb)
}

/// The GeGLU form of `qmm_coop` (`QmmCoopGlu`) for a stacked [gate; up] matrix, its gate rows
/// and its tokens per workgroup: 128 tokens, as qmm_coop's tile.
pub fn qmm_coop_glu_shape() -> (Kernel, u32, u32) {
    let tb = 2;
    (Kernel::QmmCoopGlu { tb }, 64, 64 * tb)
}

/// Ranges `qmm` (or with `coop`, `qmm_coop`) splits the k loop of a `rows` × `cols` matrix into
/// for chunks of `tokens` tokens with tiles of `rows_per_wg` rows × `tok_per_wg` tokens (1: no
/// split): 1, 2, 4 or 8, each range whole 64-value groups.
/// - `qmm` (SIMT): the fewest that give at least [`QMM_MIN_WORKGROUPS`] workgroups, each range
///   at least 256 values long.
/// - `qmm_coop`: the fewest of least modelled time (PERF_NOTES.md, sessions 10 and 12): one
///   128 × 128 tile fills an SM, so the tiles run in waves of [`QMM_COOP_WAVE`], each as long as
///   its range of k, and a split adds qmm_sum's pass over `splits + 1` partial outputs:
///   t ≈ ⌈tiles · s / wave⌉ · (cols / s) · 0.056 µs + [s > 1] · (s + 1) · rows · tokens · 3.3e-6 µs
///   (fitted on the H200's kbench rows: within 10 % of 40 of the 44 measured times of 11 E2B/E4B
///   shapes × 4 splits, median 3 %, the 256-row k projection's 20–38 % under, as its fixed costs
///   are not modelled; it picks the fastest measured split of each shape, where the workgroup
///   threshold missed both q projections).
///
/// `KESTREL_QMM_SPLIT_RULE=workgroups` gives `qmm_coop` the SIMT rule (an A/B knob).
pub fn qmm_splits(coop: bool, rows: usize, cols: usize, tokens: usize, rows_per_wg: u32, tok_per_wg: u32) -> u32 {
    let tiles = rows.div_ceil(rows_per_wg as usize) * tokens.div_ceil(tok_per_wg as usize);
    let valid = |s: usize| s == 1 || (cols.is_multiple_of(64 * s) && cols / s >= 256);
    let model = coop && std::env::var("KESTREL_QMM_SPLIT_RULE").as_deref() != Ok("workgroups");
    if model {
        // The model prices the partials' traffic itself: ranges need only be whole groups.
        let valid = |s: usize| cols.is_multiple_of(64 * s);
        let time = |s: usize| {
            let waves = (tiles * s).div_ceil(QMM_COOP_WAVE) as f64;
            let sum = if s > 1 { (s + 1) as f64 * (rows * tokens) as f64 * 3.3e-6 } else { 0.0 };
            waves * (cols / s) as f64 * 0.056 + sum
        };
        let best =
            [1usize, 2, 4, 8].into_iter().filter(|&s| valid(s)).fold(1, |b, s| if time(s) < time(b) { s } else { b });
        return best as u32;
    }
    let mut s = 1;
    while tiles * s < QMM_MIN_WORKGROUPS && valid(2 * s) && s < 8 {
        s *= 2;
    }
    s as u32
}

/// Workgroups below which `qmm_splits` splits the k loop of the SIMT `qmm`. Measured on the H200
/// (PERF_NOTES.md, session 5, 512-token chunks): E4B down (320 workgroups) 1142 → 951 µs split
/// in 2, E2B q|k|v (320) 179 → 160, E2B k (32) 223 → 77 split in 4; E4B q|k|v (384) no gain.
pub const QMM_MIN_WORKGROUPS: usize = 384;

/// qmm_coop tiles of 128 × 128 in flight at once on the H200 (132 SMs, one such workgroup each:
/// its 48 KiB of workgroup memory and 16 accumulator blocks per subgroup); the wave of
/// [`qmm_splits`]'s model. Other devices get the same model with this wave: a split is a speed
/// choice only, never a change in the result's tolerance.
pub const QMM_COOP_WAVE: usize = 132;

/// True when the prefill mat-mat `qmm` applies: 4-bit weights in whole 64-value groups and an
/// x stride of whole vec4s (as for `qmv`).
pub fn qmm_applies(format: Format, cols: usize, x_stride: usize) -> bool {
    format == Format::Q4 && cols.is_multiple_of(64) && x_stride.is_multiple_of(4)
}

/// The most values of a row an rmsnorm thread holds in registers (`V` in rmsnorm.wgsl): with
/// 256 threads, rows up to 3072 values (every Gemma 4 hidden size) are loaded in one round.
pub const RMSNORM_V: u32 = 12;

/// Threads of the decode and verify steps' norm ([`rmsnorm`]) where the device allows them.
/// A decode norm is one workgroup's latency chain: 1024 threads beat 256 (PERF_NOTES.md,
/// session 18: tg128 E4B +0.5 %, 26B +1.6 %, E2B even), and 512 beats 1024 in the step
/// although the norm's own timestamped time does not fall (session 31: E4B 251.3 → 256.3,
/// E2B even). The 26B lost at 512 (276.5 → 272.8), in the timestamps through its MoE close,
/// which took these threads then ([`MOE_NORM_WG`]); its norms at 512 beside a close at 1024
/// are not yet measured (tools/device/sessions/session31-p3.sh).
pub const RMSNORM_WG: u32 = 512;

/// Threads of the MoE block's close ([`moe_norm`]) where the device allows them: at 512 its
/// timestamped time rises 11.3 → 12.5 µs a dispatch and the 26B's tg128 falls 276.5 → 272.8
/// (PERF_NOTES.md, session 31), so it keeps 1024.
pub const MOE_NORM_WG: u32 = 1024;

/// The threads of a one-workgroup decode norm: `want` where the device allows it, else 256
/// (every device's minimum). `knob` (256, 512 or 1024, within `max_threads`) overrides it for
/// A/B runs.
fn decode_norm_wg(knob: &str, want: u32, max_threads: u32) -> u32 {
    let fits = |w: &u32| *w <= max_threads;
    let set = env_u32(knob).filter(|w| matches!(w, 256 | 512 | 1024)).filter(fits);
    set.unwrap_or(if fits(&want) { want } else { 256 })
}

/// The rmsnorm variant (decode and verify steps' norm) for rows of `n` values on a device that
/// runs up to `max_threads` invocations per workgroup: [`RMSNORM_WG`] threads where it can (256
/// where not), V = ceil(n / WG) (at most [`RMSNORM_V`]), so that a thread holds no registers for
/// values past the row. Chunks run the rows form (rmsnorm_rows.wgsl; session 13 found
/// one-workgroup norms slower there). Verify steps run the same form, so verify = decode
/// bitwise holds. A/B knobs: `KESTREL_RMSNORM_WG=256|512|1024` the threads (within
/// `max_threads`), `KESTREL_RMSNORM_V` V.
pub fn rmsnorm(n: usize, max_threads: u32) -> Kernel {
    let wg = decode_norm_wg("KESTREL_RMSNORM_WG", RMSNORM_WG, max_threads);
    let v = env_u32("KESTREL_RMSNORM_V").filter(|v| (1..=RMSNORM_V).contains(v));
    Kernel::RmsNorm { v: v.unwrap_or_else(|| rmsnorm_v(n, wg)), wg }
}

/// The most vec4s of a row an rmsnorm_rows thread holds per array (`V4`).
pub const RMSNORM_ROWS_V4: u32 = 16;

/// Threads per row of the chunk norms' rows form by default (`KESTREL_NORM_ROWS` overrides:
/// 64, 128 or 256, or 0 for rmsnorm.wgsl's form in chunks too).
pub const RMSNORM_ROWS_WG: u32 = 256;

/// The rows form of the chunk norm with params `p` on `wg` threads per row
/// (rmsnorm_rows.wgsl), where it applies: rows of vec4 (n, the strides the norm uses and its
/// weight offsets multiples of 4), at most [`RMSNORM_ROWS_V4`] vec4s per thread, and with
/// group sums (`p.sums` ≠ 0) one segment and groups of whole vec4s that tile the row; over
/// split-k partials (`p.splits` > 1), one segment of the chunk's own rows (x_stride = n, no
/// LM-head row selection).
pub fn rmsnorm_rows(p: &NormParams, wg: u32) -> Option<Kernel> {
    let chained = |off: u32, j: u32| p.chain < j || off.is_multiple_of(4);
    let vec4_rows = p.n.is_multiple_of(4)
        && p.x_stride.is_multiple_of(4)
        && p.out_stride.is_multiple_of(4)
        && (p.chain == 0 || p.out2_stride.is_multiple_of(4))
        && (p.w_off == NO_WEIGHT || p.w_off.is_multiple_of(4))
        && chained(p.w2_off, 1)
        && chained(p.w3_off, 2)
        && chained(p.w4_off, 3);
    let sums = p.sums != 0;
    let sums_fit = !sums || (p.segs == 1 && p.gs > 0 && p.gs.is_multiple_of(4) && p.n.is_multiple_of(p.gs));
    let parts = p.splits > 1;
    let parts_fit = !parts || (p.segs == 1 && p.x_stride == p.n && p.x_row_sel == 0 && p.count_sel == 0);
    if !matches!(wg, 64 | 128 | 256) || !vec4_rows || !sums_fit || !parts_fit {
        return None;
    }
    let v4 = p.n.div_ceil(4 * wg).max(1);
    (v4 <= RMSNORM_ROWS_V4).then_some(Kernel::RmsNormRows { v4, wg, sums, parts })
}

/// Threads per head of head_norm_rope and qkv_norm_rope at their widest: one pass over
/// d ≤ 1024 values; the form for heads wider than 512.
pub const HEAD_NORM_WG: u32 = 256;

/// The threads per head of the head norms for head dim `d`: 128 where d ≤ 512 (each thread
/// holds up to four values; PERF_NOTES.md session 18: a chunk's qkv_norm_rope 0.57 → 0.44 ms
/// on E4B, decode's the same), else [`HEAD_NORM_WG`]. `KESTREL_HEAD_NORM_WG=64|128|256`
/// overrides it where d ≤ 4 · that (an A/B knob).
pub fn head_norm_wg(d: usize) -> u32 {
    let fits = |wg: u32| d <= 4 * wg as usize;
    let knob = std::env::var("KESTREL_HEAD_NORM_WG").ok().and_then(|v| v.parse::<u32>().ok());
    let default = if fits(128) { 128 } else { HEAD_NORM_WG };
    knob.filter(|&wg| matches!(wg, 64 | 128 | 256) && fits(wg)).unwrap_or(default)
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

/// The MoE block's close (moe_norm.wgsl) for rows of `n` values and the router's top `k`, on
/// [`MOE_NORM_WG`] threads where the device allows them (256 where not; `KESTREL_MOE_NORM_WG`
/// overrides, as [`rmsnorm`]'s knob), V = ceil(n / WG). Its sums run in the order of an rmsnorm
/// of the same WG and V: decode and verify both run this kernel, so nothing needs it to match
/// the rmsnorm dispatches the step runs elsewhere.
pub fn moe_norm(n: usize, k: usize, max_threads: u32) -> Kernel {
    let wg = decode_norm_wg("KESTREL_MOE_NORM_WG", MOE_NORM_WG, max_threads);
    Kernel::MoeNorm { v: rmsnorm_v(n, wg), wg, k: k as u32 }
}

/// Registers per thread of an rmsnorm of `wg` threads over rows of `n` values.
pub fn rmsnorm_v(n: usize, wg: u32) -> u32 {
    (n.div_ceil(wg as usize) as u32).clamp(1, RMSNORM_V)
}

/// The chunk attention variant for a head dimension (≤ 512, a multiple of 4: the value phase
/// splits a 64-key tile into slices of 16 / ceil(d / 256) keys).
pub fn attention_chunk(head_dim: usize) -> Kernel {
    Kernel::Attention { dv: (head_dim as u32).div_ceil(64) }
}

/// Tokens (queries) per workgroup of chunk attention (`BQ` in attention.wgsl).
pub const ATTN_BQ: u32 = 16;

/// Chunk attention on tensor cores for a head dimension, where it applies (a multiple of 64,
/// ≤ 512: the kernel's stages are 64 dims, and each subgroup keeps one 16 × 16 O block per
/// value stage in registers, 8 at most); the device must have f16 cooperative matrices in
/// subgroups of 32 (`Gpu::coop_f16`).
pub fn attention_chunk_coop(head_dim: usize) -> Option<Kernel> {
    (head_dim % 64 == 0 && (64..=512).contains(&head_dim))
        .then_some(Kernel::AttentionCoop { d: head_dim as u32, sums: false })
}

/// Tokens (queries) per workgroup of attention_coop (`BQ` in attention_coop.wgsl). A 16-query,
/// 128-thread form lost on the H200 (PERF_NOTES.md, session 15;
/// tools/experiments/attention-coop-q16.patch).
pub const ATTN_COOP_BQ: u32 = 32;

/// The attention_split variant for a head dimension (≤ 1024); `qnorm`: its form that norms and
/// rotates q itself (attention_qnorm.wgsl).
pub fn attention_split(head_dim: usize, qnorm: bool) -> Kernel {
    Kernel::AttentionSplit { dk: (head_dim as u32).div_ceil(64), qnorm }
}

/// The attention_short variant for a head dimension (a multiple of 8, ≤ 1024) on a device with
/// these limits: [`SHORT_WG_MAX`] threads per (head, token) where the device takes them and its
/// workgroup memory holds the kernel's arrays, else fewer. The value groups' sums in the default
/// form. A/B knobs for measurements: `KESTREL_ATTN_SHORT_SUM=tree|group0` picks the sum,
/// `KESTREL_ATTN_SHORT_WG=256|512|1024` the largest size.
pub fn attention_short(head_dim: usize, qnorm: bool, limits: &wgpu::Limits) -> Kernel {
    let sum_group0 = std::env::var("KESTREL_ATTN_SHORT_SUM").map_or(SHORT_SUM_GROUP0, |v| v == "group0");
    let max_wg = env_u32("KESTREL_ATTN_SHORT_WG").unwrap_or(SHORT_WG_MAX);
    attention_short_form(head_dim, qnorm, sum_group0, max_wg, limits)
}

/// The largest attention_short workgroup a decode or verify step takes. On the H200 with group
/// 0's sum, 512 threads against 1024 (PERF_NOTES.md, session 30, two alternating rounds each):
/// E2B tg128 380.8 / 381.6 → 383.9 / 383.5, E4B 249.7 / 249.6 → 251.3 / 251.1, the 26B
/// 277.2 / 276.5 → 277.6 / 277.3 (1024 had won with the tree sum in session 26's shape sweep,
/// against other G / GV at 512; plain 512 had not been run in the step).
pub const SHORT_WG_MAX: u32 = 512;

/// attention_short with the value groups' sums added by group 0 after one barrier
/// (`sum_group0`) or by a halving tree, at most `max_wg` threads per (head, token) (1024, 512
/// or 256: the largest of them the device's limits allow).
pub fn attention_short_form(
    head_dim: usize,
    qnorm: bool,
    sum_group0: bool,
    max_wg: u32,
    limits: &wgpu::Limits,
) -> Kernel {
    let d4 = head_dim as u32 / 4;
    let wg = [1024u32, 512, 256]
        .into_iter()
        .filter(|&wg| wg <= max_wg)
        .find(|&wg| {
            wg <= limits.max_compute_invocations_per_workgroup
                && wg <= limits.max_compute_workgroup_size_x
                && short_shared_bytes(d4, wg, qnorm, sum_group0) <= limits.max_compute_workgroup_storage_size
        })
        .unwrap_or(256);
    Kernel::AttentionShort { d4, wg, qnorm, sum_group0 }
}

/// attention_short's workgroup memory: qs (1024 floats), sc and red (WG each), vh and, in the
/// q-norm form, qn_red (WG).
fn short_shared_bytes(d4: u32, wg: u32, qnorm: bool, sum_group0: bool) -> u32 {
    4 * (1024 + 2 * wg + if qnorm { wg } else { 0 }) + 16 * short_vh_vec4s(wg, short_shape(d4, wg).tv, sum_group0)
}

/// attention_short's vh in vec4s: the halving tree's upper half, or (group 0's sum) every value
/// group after the first.
fn short_vh_vec4s(wg: u32, tv: u32, sum_group0: bool) -> u32 {
    if sum_group0 {
        (wg - tv).max(1)
    } else {
        wg / 2
    }
}

/// attention_short's thread shapes for a head dim of `d4` vec4s (the constants of
/// attention_short.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortShape {
    /// Lanes per key in the score phase: 16 up to head dim 256 (four vec4s per lane there),
    /// 32 past it.
    pub tpk: u32,
    /// vec4s of a key row per lane.
    pub vpl: u32,
    /// Keys per team in flight.
    pub g: u32,
    /// Lanes per value row: a power of two ≥ d4 (one vec4 per lane), at least 64.
    pub tv: u32,
    /// Value rows per group in flight.
    pub gv: u32,
}

/// attention_short's default sum of the value groups: group 0 adds the others after one barrier
/// (session 28's form). On the H200 against the halving tree (PERF_NOTES.md, session 30, two
/// alternating rounds, 1024 threads): E2B tg128 378.8 / 379.2 → 381.7 / 381.4, E4B
/// 248.6 / 248.5 → 248.9 / 249.9, the 26B 276.4 / 276.2 → 276.7 / 277.1; kbench 0.02–0.46 µs
/// faster per dispatch at every row length (16–1025 keys).
const SHORT_SUM_GROUP0: bool = true;

pub fn short_shape(d4: u32, wg: u32) -> ShortShape {
    let tpk = if d4 <= 64 { 16 } else { 32 };
    // KESTREL_ATTN_SHORT_G / _GV: keys and value rows in flight (A/B knobs for measurements).
    let g = env_u32("KESTREL_ATTN_SHORT_G").filter(|g| (1..=8).contains(g)).unwrap_or(2);
    let gv = env_u32("KESTREL_ATTN_SHORT_GV").filter(|g| (1..=16).contains(g)).unwrap_or(4);
    ShortShape { tpk, vpl: d4.div_ceil(tpk), g, tv: d4.next_power_of_two().clamp(64, wg), gv }
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
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

/// Threads of one attention_split workgroup (`WG` in attention_tile.wgsl).
const ATTN_SPLIT_WG: u32 = 64;

/// Keys whose K (then V) rows attention_split loads together (`G` in attention_split.wgsl).
pub const ATTN_KEYS_IN_FLIGHT: u32 = 4;

/// Splits attention_combine reads per round (`U` in attention_combine.wgsl): half of
/// [`ATTN_SPLITS`], each a load in flight.
pub const COMBINE_U: u32 = 16;

/// The router's form: `router_topk.wgsl` with STAGED (the chosen experts' logits and scales from
/// workgroup memory, one global round trip fewer) unless `KESTREL_ROUTER_STAGED=0`. On the H200
/// (PERF_NOTES.md, session 20 #3): 4.16 → 4.01 µs in kbench's latency row, 26B decode steps'
/// 30 routers 313 → 305 µs under per-dispatch timestamps; tg128 even within its noise.
pub fn router_staged() -> bool {
    std::env::var("KESTREL_ROUTER_STAGED").as_deref() != Ok("0")
}

/// Threads of one router_topk workgroup (one per expert: the most experts it takes; the
/// backend refuses models with more: WgpuBackend::with_gpu).
pub const ROUTER_TOPK_WG: u32 = 256;

/// Threads of one `qmv` workgroup (`WG` in qmv.wgsl).
pub const QMV_WG: u32 = 128;

/// The `qmv` variant for a `rows × cols` 4-bit matrix and a token tile of `tok`, and its rows per
/// workgroup; `None` where qmv does not apply (cols not whole 64-value groups, or an x stride
/// that is not whole vec4s). Lanes per row follow the matrix shape only, so every token tile of
/// a matrix (decode, verify) reduces a row the same way: bitwise-identical rows.
///
/// The rule is the H200 sweep of `cargo bench --bench kernels -- --sweep` on the warmed harness
/// and the decode steps' per-kernel times (PERF_NOTES.md, session 6), with x staged in workgroup
/// memory where lanes ≤ 32 and x takes several rounds ([`qmv_staged`]): tall matrices (≥ 12288
/// rows: the stacked gate|up of E2B and E4B; 26B's 8192-row q|k|v was slower so) take 16 lanes ×
/// 2 rows per team, and 16 × 8 where their rows are long (≥ 16384 values: 16 or more staging
/// rounds, each round's x digits then serve 64 rows; the 256 MiB matrix 132.2 → 99.9 µs, session
/// 11's sweep; no matrix of the three models is that long), the LM head (≥ 65536 rows) 8 × 4
/// (session 7's sweep with the weights read from memory: E2B 117.7 → 104.0 µs, E4B 183.7 → 170.8;
/// still the best with the integer loop, session 11); the rest about two 32-value chunks
/// per lane (lanes = the power of two ≥ chunks / 2, at most [`QMV_MAX_LANES`]), four rows per
/// team while that still leaves ≥ 256 workgroups (2 per SM), fewer otherwise.
pub fn qmv_shape(rows: usize, cols: usize, x_stride: usize, tok: u32) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_dense_tile(rows, cols);
    Some((Kernel::Qmv { tok, lanes, rpt, pro: 0 }, QMV_WG / lanes * rpt))
}

/// Lanes per row and rows per team of the dense qmv rule (see [`qmv_shape`]).
fn qmv_dense_tile(rows: usize, cols: usize) -> (u32, u32) {
    if let Some(tile) = qmv_tile_override(rows, cols) {
        return tile;
    }
    match (rows, cols) {
        (65536.., _) => (8, 4),
        (12288.., 16384..) => (16, 8),
        (12288.., _) => (16, 2),
        _ => qmv_tile(rows, cols),
    }
}

/// `KESTREL_QMV_TILES="ROWSxCOLS=LANESxRPT,…"`: the tile of those exact shapes (a stacked
/// gate|up counts its 2 · rows; routed experts their rows times top_k), for A/B runs of a rule
/// change end to end. An experiment knob, not a setting: entries that do not parse, or name a
/// tile qmv has no variant for, are ignored.
fn qmv_tile_override(rows: usize, cols: usize) -> Option<(u32, u32)> {
    let spec = std::env::var("KESTREL_QMV_TILES").ok()?;
    spec.split(',').find_map(|entry| {
        let (shape, tile) = entry.trim().split_once('=')?;
        let (r, c) = shape.split_once('x')?;
        let (l, t) = tile.split_once('x')?;
        let (lanes, rpt): (u32, u32) = (l.parse().ok()?, t.parse().ok()?);
        let valid = lanes.is_power_of_two() && (8..=QMV_WG).contains(&lanes) && [1, 2, 4, 8].contains(&rpt);
        (valid && r.parse::<usize>().ok()? == rows && c.parse::<usize>().ok()? == cols).then_some((lanes, rpt))
    })
}

/// Lanes per row and rows per team of the general rule (the routed experts' rule, whose loop
/// is not staged) for `rows` rows spread over the grid.
fn qmv_tile(rows: usize, cols: usize) -> (u32, u32) {
    let lanes = ((cols / 32) as u32).div_ceil(2).next_power_of_two().clamp(8, qmv_max_lanes());
    let teams = (QMV_WG / lanes) as usize;
    let rpt = [4u32, 2].into_iter().find(|&r| rows.div_ceil(teams * r as usize) >= 256).unwrap_or(1);
    (lanes, rpt)
}

/// The general rule's widest team: [`QMV_MAX_LANES`], or `KESTREL_QMV_MAX_LANES` (a power of two,
/// 8 to 128; 128 is the rule before session 24) as an A/B knob.
fn qmv_max_lanes() -> u32 {
    std::env::var("KESTREL_QMV_MAX_LANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|l: &u32| l.is_power_of_two() && (8..=QMV_WG).contains(l))
        .unwrap_or(QMV_MAX_LANES)
}

/// The general rule's lanes per row at most one subgroup of 32 (on NVIDIA: a row's sum without a
/// reduction across warps), so dense rows of more than 64 chunks take the staged loop. Measured on the H200 with the clock held up
/// (session 24): kbench's E4B q|k|v 9.17 µs at 64 lanes × 4 rows, 7.87 at 32 × 2; decode, one
/// call alternating with the 128-lane rule, E2B 350.0 → 358.4, E4B 213.2 → 232.6, 26B 253.7 →
/// 258.2 tok/s (p5).
const QMV_MAX_LANES: u32 = 32;

/// The `qmv_glu` variant for a stacked [gate; up] matrix of `2 · rows` rows × `cols` and a
/// token tile of `tok`, and its output rows per workgroup; `None` where qmv does not apply.
/// Lanes and rows per team follow qmv's rule for the stacked matrix (at least one gate/up pair
/// per team), so rows reduce as qmv would reduce them.
pub fn qmv_glu_shape(rows: usize, cols: usize, x_stride: usize, tok: u32) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_stride.is_multiple_of(4) {
        return None;
    }
    // Tall stacks of the widths whose GeGLU takes the fused-norm prologue (E2B's 1536) get two
    // pairs per team: half the workgroups, so half the redundant prologues. Measured on the
    // H100 with the integer-digit loop (session 34 p1): E2B 391.4 / 390.7 → 394.7 / 402.0 tok/s,
    // the GeGLU's timestamped 22.9 → 21.9 µs a dispatch; at 8 lanes × 2 pairs 392.4 / 391.7. On
    // the float loop it gained nothing (26.7 µs), so `KESTREL_QMV_DIGITS=0` keeps the old tile
    // (that knob then gives session 33's kernels whole). The rule assumes these widths are fused,
    // as they are by default (`PRO_MAX_HIDDEN`); `KESTREL_FUSE_NORMS=0` leaves them unfused on it.
    let wide_fused =
        qmv_digits() && qmv_tile_override(2 * rows, cols).is_none() && 2 * rows >= 12288 && cols <= PRO_MAX_HIDDEN;
    let (lanes, rpt) = if wide_fused { (16, 4) } else { qmv_dense_tile(2 * rows, cols) };
    let pairs = (rpt / 2).max(1);
    Some((Kernel::QmvGlu { tok, lanes, pairs, pro: 0 }, QMV_WG / lanes * pairs))
}

/// The gated qmv (`y = gelu_tanh(W x) · gb[..]`) for `rows` × `cols` at token tile `tok`, and
/// its rows per workgroup: the plain rule's tile.
pub fn qmv_gelu_b_shape(rows: usize, cols: usize, x_stride: usize, tok: u32) -> Option<(Kernel, u32)> {
    match qmv_shape(rows, cols, x_stride, tok)? {
        (Kernel::Qmv { tok, lanes, rpt, .. }, per_wg) => Some((Kernel::QmvGeluB { tok, lanes, rpt, pro: 0 }, per_wg)),
        _ => None,
    }
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

/// The widest residual stream whose norms every kind of decode mat-vec takes over (`fuse_norm`
/// in mod.rs; past it, the kinds [`fuse_norm_into`] names). Measured on the H200 (PERF_NOTES.md, sessions 7 and 8, same binary, fused vs
/// `KESTREL_FUSE_NORMS=0` / `all`): E2B (1536) 306 → 339 tok/s, but E4B (2560) 207 → 198 and
/// 26B (2816) 202 → 184. The prologue's cost follows the bytes every workgroup reads again
/// (the norm's input, the residual and the weights: 40–45 KB per workgroup there, against 24 KB
/// at 1536); at 2560 no consumer kind gains alone (q|k|v 200, gate|up 191, per-layer gate 205),
/// and neither a three-pass prologue nor tiles of more rows per workgroup closed the gap
/// (session 25, with 32-lane teams, the per-layer gate alone does: [`fuse_norm_into`]).
pub const PRO_MAX_HIDDEN: usize = 2048;

/// Which decode mat-vecs take a residual norm past [`PRO_MAX_HIDDEN`] (`fuse_norm` in mod.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WideFuse {
    /// None: the width rule alone (sessions 7–24).
    None,
    /// The gated form (Gemma 4's per-layer gate).
    Gated,
    /// The gated form and the GeGLU.
    GatedGlu,
}

/// Whether a residual norm of width `h` moves into the decode mat-vec `consumer`: every kind up
/// to `up_to` (0: none), and past it the kinds `wide` names. Measured on the H200 with today's
/// 32-lane teams (PERF_NOTES.md, session 25, E4B at 2560, -p 16 -n 128): the width rule
/// 229.3 / 229.4 (p2) and 229.8 / 229.4 (final call) tok/s; into the gated per-layer gate (64
/// workgroups) 235.7 (p2, one run: the default); the gate and q|k|v (256–384) 222.3 (p2); the
/// gate and the GeGLU (1280) 231.7 / 231.8 (final call); all three 230.9 (p2); the 26B's q|k|v
/// (its only fusable consumer) 255.8 → 244.3. Why the GeGLU and q|k|v take back what the gate
/// gains is not known (all read the same 40 KB prologue per workgroup).
pub fn fuse_norm_into(consumer: Kernel, h: usize, up_to: usize, wide: WideFuse) -> bool {
    up_to > 0
        && (h <= up_to
            || match consumer {
                Kernel::QmvGeluB { .. } => wide != WideFuse::None,
                Kernel::QmvGlu { .. } => wide == WideFuse::GatedGlu,
                _ => false,
            })
}

/// Token tile of the fused-norm qmv's verify form: the tile's inputs live in workgroup memory
/// (4 bytes × cols per token), so the tile is smaller than [`MATMUL_VERIFY_TOK`]. Widening it to
/// the most that fits lost on an H100 (E2B verify of 4 tokens 5.34 → 6.52 ms, E4B 8.50 → 8.97:
/// one 4-token tile of these workgroup-memory-heavy kernels against two 2-token ones;
/// PERF_NOTES.md, session 38 #5).
pub const PRO_VERIFY_TOK: u32 = 2;

/// The fused-norm form of a qmv variant (same lanes and rows per team, so the same rows) at
/// token tile `tok`, over rows of `cols` values, where the tile's inputs fit in workgroup
/// memory beside the reduction's (`None` elsewhere, and for other kernels).
pub fn with_norm(kernel: Kernel, tok: u32, cols: usize, max_wg_bytes: u32) -> Option<Kernel> {
    let pro = (cols / 4) as u32;
    let (fused, rpt) = match kernel {
        Kernel::Qmv { lanes, rpt, .. } => (Kernel::Qmv { tok, lanes, rpt, pro }, rpt),
        Kernel::QmvGlu { lanes, pairs, .. } => (Kernel::QmvGlu { tok, lanes, pairs, pro }, 2 * pairs),
        Kernel::QmvGeluB { lanes, rpt, .. } => (Kernel::QmvGeluB { tok, lanes, rpt, pro }, rpt),
        _ => return None,
    };
    let bytes = 16 * tok * pro + 4 * rpt * tok * QMV_WG;
    (cols.is_multiple_of(64) && bytes <= max_wg_bytes).then_some(fused)
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

/// Sentinel for "no norm weight" (`NO_WEIGHT` in the WGSL).
pub const NO_WEIGHT: u32 = u32::MAX;

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

/// group_sum's grid x for `n` = mult · G (row, group) pairs: 64 pairs per workgroup.
pub fn group_sum_groups_x(n: usize) -> u32 {
    n.div_ceil(64) as u32
}

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

/// Key splits per (head, token) of the decode attention: enough workgroups to fill a GPU at
/// 8–16 heads; at most 64 (attention_combine reads them in one pass).
pub const ATTN_SPLITS: u32 = 32;

/// Decode and verify rows of at most this many keys take attention_short
/// ([`WgpuOptions::attn_short`](super::WgpuOptions::attn_short)'s default).
pub const ATTN_SHORT_MAX: u32 = 256;

/// The decode attention's key splits: [`ATTN_SPLITS`], or `KESTREL_ATTN_SPLITS` (1 to
/// ATTN_SPLITS: buffers are sized for ATTN_SPLITS) as an A/B knob.
pub fn attn_splits() -> u32 {
    std::env::var("KESTREL_ATTN_SPLITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s| (1..=ATTN_SPLITS).contains(s))
        .unwrap_or(ATTN_SPLITS)
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
    /// Chunks of [`ARGMAX_CHUNK`] logits per row: [`argmax_chunks`].
    pub chunks: u32,
    pub _pad: u32,
}

/// Logits each thread of softcap_argmax holds (its loads in flight).
const ARGMAX_U: u32 = 8;

/// Logits per softcap_argmax workgroup (256 threads × [`ARGMAX_U`]): a 262144-entry row is 128
/// workgroups, and argmax_merge reduces 128 pairs.
pub const ARGMAX_CHUNK: u32 = 256 * ARGMAX_U;

/// softcap_argmax's workgroups per row (grid x) and the pairs argmax_merge reads per row.
pub fn argmax_chunks(vocab: usize) -> u32 {
    (vocab as u32).div_ceil(ARGMAX_CHUNK)
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
pub struct CopyParams {
    /// vec4 elements to copy.
    pub n: u32,
    pub _pad: [u32; 3],
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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CombineParams {
    pub n: u32,
    pub top_k: u32,
    pub _pad: [u32; 2],
}

/// Compiled pipelines, created on first use.
pub struct Pipelines {
    cache: HashMap<Kernel, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    /// One layout per binding signature, so one bind group serves every variant of a kernel
    /// (the decode and prefill matmuls share theirs).
    layouts: HashMap<&'static [Bind], wgpu::BindGroupLayout>,
    /// naga's runtime checks in the generated shaders (index clamps on workgroup and private
    /// arrays, a counter in every loop). Off unless `KESTREL_SHADER_CHECKS=1`: on the H200 they
    /// cost 7 % of E2B decode and 12 % of its prefill (PERF_NOTES.md, session 5). Storage
    /// buffer accesses keep the device's robust buffer access either way; CI runs the kernel
    /// tests both ways.
    checks: bool,
    /// Subgroup size the kernels' reductions rely on: the device's when it has subgroup
    /// operations and reports one fixed size (NVIDIA: 32; lavapipe: its SIMD width), else 0.
    /// `KESTREL_SUBGROUPS=0` turns them off (A/B measurements).
    subgroup: u32,
}

impl Pipelines {
    /// The subgroup size the kernels were built for (0: none; see `subgroup`).
    pub fn subgroup(&self) -> u32 {
        self.subgroup
    }

    pub fn new(gpu: &super::context::Gpu) -> Self {
        let checks = std::env::var("KESTREL_SHADER_CHECKS").is_ok_and(|v| v == "1");
        let fixed =
            gpu.info.subgroup_min_size == gpu.info.subgroup_max_size && gpu.info.subgroup_min_size.is_power_of_two();
        let allowed = std::env::var("KESTREL_SUBGROUPS").map_or(true, |v| v != "0");
        let subgroup = if gpu.subgroups() && fixed && allowed { gpu.info.subgroup_min_size } else { 0 };
        Pipelines { cache: HashMap::new(), layouts: HashMap::new(), checks, subgroup }
    }

    /// A hash of the WGSL `k` compiles from on this device (for [`super::WgpuBackend::program_listing`]).
    pub fn source_hash(&self, k: Kernel) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        k.source(self.subgroup).hash(&mut h);
        h.finish()
    }

    /// The pipeline of `k` and the layout its bind groups must use.
    pub fn get(&mut self, device: &wgpu::Device, k: Kernel) -> Result<&(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        if !self.cache.contains_key(&k) {
            let label = k.label();
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let entries: Vec<wgpu::BindGroupLayoutEntry> = k
                .bindings()
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                    binding: i as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: match b {
                            Bind::Read => wgpu::BufferBindingType::Storage { read_only: true },
                            Bind::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                            Bind::Uniform => wgpu::BufferBindingType::Uniform,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            let bgl = self
                .layouts
                .entry(k.bindings())
                .or_insert_with(|| {
                    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(&label),
                        entries: &entries,
                    })
                })
                .clone();
            let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&label),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(k.source(self.subgroup).into()),
            };
            let module = if self.checks {
                device.create_shader_module(desc)
            } else {
                // SAFETY: every index a kernel computes is bounded by the host-checked shapes
                // its header states (tests/kernels.rs runs every kernel against the CPU
                // reference with and without the checks); loops are bounded by uniforms.
                unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
            };
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    // Kernels initialise what they read; skip the zero-fill prologue.
                    zero_initialize_workgroup_memory: false,
                    ..Default::default()
                },
                cache: None,
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Gpu(format!("kernel {label} failed to compile: {e}")));
            }
            self.cache.insert(k, (pipeline, bgl));
        }
        Ok(&self.cache[&k])
    }
}

#[cfg(test)]
mod tests {
    use super::unroll;

    /// The split rule of the tensor-core mat-mat against the H200's kbench table it was fitted to
    /// (benches/results/2026-12-01-h200-session12-p2-qmm-coop-acc.txt, the two-accumulator rows:
    /// µs for 1, 2, 4, 8 ranges of a 512-token chunk, 128 × 128 tiles): the split it picks must
    /// have measured within 1 % of the fastest of every shape (E2B q|k|v's 1 and 4 are a tie).
    #[test]
    fn qmm_coop_split_rule_picks_the_measured_fastest() {
        let table: [(&str, usize, usize, [f64; 4]); 11] = [
            ("E2B q_proj", 2048, 1536, [94.3, 56.6, 64.9, 81.1]),
            ("E2B k_proj", 256, 1536, [90.7, 55.9, 34.5, 23.8]),
            ("E2B gate/up", 6144, 1536, [180.1, 158.1, 187.1, 241.2]),
            ("E2B down", 1536, 6144, [347.0, 179.7, 188.0, 152.3]),
            ("E4B q_proj", 2048, 2560, [150.1, 83.6, 92.0, 108.0]),
            ("E4B gate/up", 10240, 2560, [430.8, 393.6, 438.8, 528.8]),
            ("E4B down", 2560, 10240, [550.1, 579.1, 438.7, 389.7]),
            ("E2B q|k|v", 2560, 1536, [92.6, 104.9, 92.1, 103.6]),
            ("E2B gate|up", 12288, 1536, [263.9, 310.7, 366.0, 473.0]),
            ("E4B q|k|v", 3072, 2560, [144.3, 160.9, 134.7, 164.6]),
            ("E4B gate|up", 20480, 2560, [700.0, 778.7, 872.6, 1026.2]),
        ];
        for (name, rows, cols, us) in table {
            let fastest = us.iter().copied().fold(f64::MAX, f64::min);
            let s = super::qmm_splits(true, rows, cols, 512, 128, 128);
            let picked = us[s.trailing_zeros() as usize];
            assert!(picked <= fastest * 1.01, "{name}: picked {s} ranges ({picked} µs), fastest {fastest} µs: {us:?}");
        }
    }

    /// The fused-norm policy (session 25): below PRO_MAX_HIDDEN every kind, past it only the
    /// kinds `wide` names, never with `up_to` 0 (the unfused option the tests use).
    #[test]
    fn norms_fuse_past_the_width_only_into_the_kinds_named() {
        use super::{fuse_norm_into, Kernel, WideFuse, PRO_MAX_HIDDEN};
        let plain = Kernel::Qmv { tok: 1, lanes: 32, rpt: 2, pro: 0 };
        let glu = Kernel::QmvGlu { tok: 1, lanes: 16, pairs: 1, pro: 0 };
        let gated = Kernel::QmvGeluB { tok: 1, lanes: 32, rpt: 1, pro: 0 };
        for k in [plain, glu, gated] {
            assert!(fuse_norm_into(k, 1536, PRO_MAX_HIDDEN, WideFuse::None), "{k:?} at 1536");
            assert!(!fuse_norm_into(k, 1536, 0, WideFuse::GatedGlu), "{k:?} with fusion off");
            assert!(fuse_norm_into(k, 2560, usize::MAX, WideFuse::None), "{k:?} at 2560, everything fused");
            assert!(!fuse_norm_into(k, 2560, PRO_MAX_HIDDEN, WideFuse::None), "{k:?} at 2560, the width rule");
        }
        assert!(
            fuse_norm_into(gated, 2560, PRO_MAX_HIDDEN, WideFuse::Gated)
                && !fuse_norm_into(glu, 2560, PRO_MAX_HIDDEN, WideFuse::Gated)
        );
        assert!(
            fuse_norm_into(glu, 2816, PRO_MAX_HIDDEN, WideFuse::GatedGlu)
                && !fuse_norm_into(plain, 2816, PRO_MAX_HIDDEN, WideFuse::GatedGlu)
        );
    }

    #[test]
    fn unroll_expands_nested_blocks() {
        let src = "a\n  // @unroll r R\n  x{r}\n  // @unroll t 2\n  y{r}_{t}\n  // @end t\n  // @end r\nb\n";
        assert_eq!(unroll(src, &[("R", 2)]), "a\n  x0\n  y0_0\n  y0_1\n  x1\n  y1_0\n  y1_1\nb\n");
        assert_eq!(unroll("// @unroll r 0\nz\n// @end r\nq\n", &[]), "q\n");
    }

    /// qmm_coop and attention_coop need a device with cooperative matrices (not lavapipe,
    /// where CI runs): naga validates their WGSL here with the capabilities such a device
    /// gives, and writes it to SPIR-V, so a shader error shows on every machine.
    #[test]
    fn coop_kernels_validate_with_cooperative_matrices() {
        use naga::valid::{Capabilities, ValidationFlags, Validator};
        let tiles = [(1, 2), (2, 2), (1, 4), (2, 4)];
        let kernels = tiles
            .iter()
            .flat_map(|&(tb, rb)| [super::Kernel::QmmCoop { tb, rb }, super::Kernel::QmmCoopMoe { tb, rb }]);
        let kernels = kernels.chain([1, 2].map(|tb| super::Kernel::QmmCoopGlu { tb }));
        let kernels = kernels.chain(
            [64, 128, 256, 512]
                .into_iter()
                .flat_map(|d| [false, true].map(|sums| super::Kernel::AttentionCoop { d, sums })),
        );
        for k in kernels {
            let src = k.source(32);
            let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
            let caps = Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16 | Capabilities::SUBGROUP;
            let info = Validator::new(ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {}", k.label(), e.emit_to_string(&src)));
            // Every workgroup variable a multiple of 16 bytes (attention_coop.wgsl, `need`: a
            // 4-byte one broke the tensor-core loads on the H200).
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).expect("layout");
            for (_, var) in module.global_variables.iter() {
                if var.space == naga::AddressSpace::WorkGroup {
                    let size = layouter[var.ty].size;
                    assert!(
                        size % 16 == 0,
                        "{}: workgroup variable {:?} is {size} bytes, not a multiple of 16",
                        k.label(),
                        var.name
                    );
                }
            }
            // And through naga's SPIR-V writer, as wgpu's Vulkan backend will.
            let opts = naga::back::spv::Options { lang_version: (1, 6), ..Default::default() };
            if let Err(e) = naga::back::spv::write_vec(&module, &info, &opts, None) {
                panic!("{}: SPIR-V: {e}", k.label());
            }
        }
    }
}
