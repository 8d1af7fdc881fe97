//! WGSL source assembly: a [`Kernel`] (its family and compile-time shape) becomes the text of one
//! compute module. Kernel files in `wgsl/` are written with `{{NAME}}` placeholders for their
//! tile constants, `// {{PART}}` lines where a shared part goes (a reduction with or without
//! subgroups, a fused-norm prologue, the format's loads), and `// @unroll NAME COUNT` blocks that
//! [`unroll`] expands; this file fills them in. Each kernel file's header says which placeholders
//! it has and who fills them.
//!
//! Why text and not WGSL `override` constants: most of the constants size function-scope arrays
//! (registers) or set the count of an `@unroll` block, and WGSL allows an override-sized array
//! only in workgroup memory and has no unrolling directive; a loop the driver leaves rolled puts
//! the arrays it indexes in local memory. Substituting every constant in one place keeps one
//! mechanism, and the module text (hashed in `kestrel bench --list-program`) names exactly what a
//! pipeline runs.

use crate::kernels::*;

/// The weight format's `load8`/`load1` (and for the grouped formats their scale/bias lookup),
/// prepended to the kernels that read weights of any format.
fn format_source(f: Format) -> &'static str {
    match f {
        Format::Q4 => {
            concat!(include_str!("../../../wgsl/formats/groups.wgsl"), include_str!("../../../wgsl/formats/q4.wgsl"))
        }
        Format::Q8 => {
            concat!(include_str!("../../../wgsl/formats/groups.wgsl"), include_str!("../../../wgsl/formats/q8.wgsl"))
        }
        Format::Bf16 => include_str!("../../../wgsl/formats/bf16.wgsl"),
        Format::F32 => include_str!("../../../wgsl/formats/f32.wgsl"),
    }
}

/// The WGSL of kernel `k`: the shared prelude (`common.wgsl`), then for weight-reading
/// kernels the format's `load8`/`load1` or the 4-bit helpers, for decode attention the shared
/// softmax step, then the kernel (with its shared loop: qmv_core, qmm_core). `sg`: the subgroup
/// size reductions may use (0: none; workgroup-memory trees instead).
pub fn kernel_source(k: Kernel, sg: u32) -> String {
    // Enable directives must open the module.
    let coop = matches!(
        k,
        Kernel::QmmCoop { .. } | Kernel::QmmCoopMoe { .. } | Kernel::QmmCoopGlu { .. } | Kernel::AttentionCoop { .. }
    );
    // Tensor-core kernels also share their operands' f16 split (halves.wgsl).
    let enables = if coop {
        concat!("enable f16;\nenable wgpu_cooperative_matrix;\n", include_str!("../../../wgsl/halves.wgsl"))
    } else {
        ""
    };
    format!("{enables}{}\n{}", include_str!("../../../wgsl/common.wgsl"), body(k, sg))
}

/// The kernel's own text after the prelude (see [`kernel_source`]).
fn body(k: Kernel, sg: u32) -> String {
    let tile = include_str!("../../../wgsl/attention_tile.wgsl");
    let params = include_str!("../../../wgsl/attention_params.wgsl");
    let moe_params = include_str!("../../../wgsl/moe_params.wgsl");
    let matmul_params = include_str!("../../../wgsl/matmul_params.wgsl");
    let groups = include_str!("../../../wgsl/formats/groups.wgsl");
    let argmax_params = include_str!("../../../wgsl/argmax_params.wgsl");
    let norm_params = include_str!("../../../wgsl/norm_params.wgsl");
    let argmax_tree = include_str!("../../../wgsl/argmax_tree.wgsl");
    match k {
        Kernel::Matmul(f, tok) => {
            let src = include_str!("../../../wgsl/matmul.wgsl");
            let src = src.replace("{{TOK}}", &tok.to_string()).replace("{{ROWS}}", &matmul_rows(tok).to_string());
            format!("{}\n{matmul_params}\n{src}", format_source(f))
        }
        Kernel::Qmv { tok, lanes, rpt, pro, digits } => format!(
            "{matmul_params}\n{}",
            qmv_source(&qmv_kernel(pro, digits, 7, sg), tok, lanes, rpt, 0, sg, pro == 0)
        ),
        Kernel::QmvGeluB { tok, lanes, rpt, pro, digits } => {
            let kernel = qmv_kernel(pro, digits, 8, sg)
                .replace("// {{GB_BINDING}}", "@group(0) @binding(7) var<storage, read> gb: array<f32>;");
            format!(
                "{}\n{}",
                include_str!("../../../wgsl/matmul_gb_params.wgsl"),
                qmv_source(&kernel, tok, lanes, rpt, QMV_GELU_B, sg, pro == 0)
            )
        }
        Kernel::QmvGlu { tok, lanes, pairs, pro, digits } => format!(
            "{matmul_params}\n{}",
            qmv_source(&qmv_kernel(pro, digits, 7, sg), tok, lanes, 2 * pairs, pairs, sg, pro == 0)
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
        Kernel::QmmMoe => {
            format!("{moe_params}\n{groups}\n{}", qmm_source(include_str!("../../../wgsl/qmm_moe.wgsl"), QMM_MOE_TM))
        }
        Kernel::QmmCoop { tb, rb } => format!(
            "{matmul_params}\n{groups}\n{}",
            qmm_coop_source(include_str!("../../../wgsl/qmm_coop.wgsl"), tb, rb, false, QMM_COOP_BIAS_PF.dense)
        ),
        Kernel::QmmCoopMoe { tb, rb } => format!(
            "{moe_params}\n{groups}\n{}",
            qmm_coop_source(include_str!("../../../wgsl/qmm_coop_moe.wgsl"), tb, rb, false, QMM_COOP_BIAS_PF.other)
        ),
        Kernel::QmmCoopGlu { tb } => {
            let gelu = include_str!("../../../wgsl/gelu.wgsl");
            format!(
                "{matmul_params}\n{gelu}\n{groups}\n{}",
                qmm_coop_source(include_str!("../../../wgsl/qmm_coop_glu.wgsl"), tb, 4, true, QMM_COOP_BIAS_PF.other)
            )
        }
        Kernel::QmmSum => format!("{matmul_params}\n{}", include_str!("../../../wgsl/qmm_sum.wgsl")),
        Kernel::GroupSum => include_str!("../../../wgsl/group_sum.wgsl").to_string(),
        Kernel::Embed(f) => format!("{}\n{}", format_source(f), include_str!("../../../wgsl/embed.wgsl")),
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
            let kernel = if matches!(k, Kernel::HeadNormRope { .. }) {
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
            // Subgroup sums need subgroups no wider than the kernel's 64 threads.
            let g = ATTN_KEYS_IN_FLIGHT;
            let sg = if sg > ATTN_SPLIT_WG { 0 } else { sg };
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
        Kernel::AttentionShort { d4, wg, qnorm } => {
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
                .replace("{{VH}}", &short_vh_vec4s(wg, s.tv).to_string());
            format!("{params}\n{}", unroll(&src, &[("VPL", s.vpl), ("G", s.g), ("GV", s.gv), ("DK", dk)]))
        }
        Kernel::AttentionCombine => {
            let src = include_str!("../../../wgsl/attention_combine.wgsl").replace("{{U}}", &COMBINE_U.to_string());
            format!("{params}\n{}", unroll(&src, &[("U", COMBINE_U)]))
        }
        Kernel::GeluMul | Kernel::GeluMulSums => {
            let sums = k == Kernel::GeluMulSums;
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
        Kernel::DraftSelect | Kernel::DraftPick => {
            let (params, kernel) = (
                include_str!("../../../wgsl/draft_params.wgsl"),
                match k {
                    Kernel::DraftSelect => include_str!("../../../wgsl/draft_select.wgsl"),
                    _ => include_str!("../../../wgsl/draft_pick.wgsl"),
                },
            );
            // argmax_tree sizes its arrays by the kernel's WG, declared in the kernel text.
            format!("{params}\n{kernel}\n{argmax_tree}")
        }
        Kernel::DraftScore(f) => format!(
            "{}\n{}\n{}",
            format_source(f),
            include_str!("../../../wgsl/draft_params.wgsl"),
            include_str!("../../../wgsl/draft_score.wgsl")
        ),
        Kernel::SpecAccept | Kernel::SpecRows => {
            let kernel = match k {
                Kernel::SpecAccept => include_str!("../../../wgsl/spec_accept.wgsl"),
                _ => include_str!("../../../wgsl/spec_rows.wgsl"),
            };
            format!("{}\n{kernel}", include_str!("../../../wgsl/spec_params.wgsl"))
        }
        Kernel::RouterTopk => {
            include_str!("../../../wgsl/router_topk.wgsl").replace("{{WG}}", &ROUTER_TOPK_WG.to_string())
        }
        Kernel::MoeMatmul(f) => {
            format!("{}\n{moe_params}\n{}", format_source(f), include_str!("../../../wgsl/moe_matmul.wgsl"))
        }
        Kernel::MoeGroup => include_str!("../../../wgsl/moe_group.wgsl").into(),
        Kernel::MoeMatmulGrouped(f) => {
            format!("{}\n{moe_params}\n{}", format_source(f), include_str!("../../../wgsl/moe_matmul_grouped.wgsl"))
        }
        Kernel::MoeCombine => include_str!("../../../wgsl/moe_combine.wgsl").into(),
        Kernel::MoeNorm { v, wg, k } => {
            let src = subgroup_text(include_str!("../../../wgsl/moe_norm.wgsl"), sg)
                .replace("{{V}}", &v.to_string())
                .replace("{{WG}}", &wg.to_string())
                .replace("{{K}}", &k.to_string());
            unroll(&src, &[("V", v), ("K", k)])
        }
        Kernel::Copy => {
            format!("{}\n{}", include_str!("../../../wgsl/copy_bindings.wgsl"), include_str!("../../../wgsl/copy.wgsl"))
        }
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

/// Which tensor-core mat-mats load their bias steps' operands a step ahead, the first step's
/// before the k loop (BIAS_PF in qmm_coop_core.wgsl: the same arithmetic, so the same bits).
struct BiasPrefetch {
    /// qmm_coop.
    dense: bool,
    /// The GeGLU and routed-expert forms.
    other: bool,
}

/// The dense form only. Measured on the H200 (ledger: 2026-12-01 qmm-bias-prefetch): dense E4B
/// chunks 59.74 / 59.74 → 59.41 / 59.52 ms (its dense mat-mats 26.66 → 26.41 ms), 26B's and
/// E2B's even; loaded ahead in the GeGLU and routed-expert forms as well, E4B's GeGLU mat-mats
/// took 23.70 → 24.02 ms and 26B's routed ones 51.1 → 52.4.
const QMM_COOP_BIAS_PF: BiasPrefetch = BiasPrefetch { dense: true, other: false };

/// `pairs` value of `qmv_source` that picks qmv.wgsl's gated form.
const QMV_GELU_B: u32 = u32::MAX;

/// qmv.wgsl, with x read from its binding, or (`pro` > 0) with qmv_norm.wgsl's fused-norm
/// prologue over rows of 4 · `pro` values, its bindings from index `first`, and with `digits`
/// the digit loop on the prologue's integer digits of x.
fn qmv_kernel(pro: u32, digits: bool, first: u32, sg: u32) -> String {
    let src = include_str!("../../../wgsl/qmv.wgsl");
    if pro == 0 {
        return src
            .replace("// {{XLOAD}}", "fn xload(i: u32) -> vec4<f32> { return x[i]; }")
            .replace("{{XROW}}", "(min(t0 + {t}u, count - 1u) * p.x_stride) / 4u")
            .replace("{{DOTS}}", "qmv_dots_wg");
    }
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

/// qmv_moe.wgsl with qmv_digits.wgsl: its loop on for x rows of 4 · `n4` > 0 values; off, the
/// digits' array is a token 8 vec4s the float loop never touches.
fn qmv_moe_kernel(n4: u32) -> String {
    format!("{}\n{}", include_str!("../../../wgsl/qmv_moe.wgsl"), digits_source(n4.max(8), n4 > 0))
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
    let cu = if tok == 1 { 2 } else { 1 };
    let stage = stageable && qmv_staged(tok, lanes, cu);
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

#[cfg(test)]
mod tests {
    use super::{kernel_source, unroll};
    use crate::kernels::Kernel;

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
        let kernels = tiles.iter().flat_map(|&(tb, rb)| [Kernel::QmmCoop { tb, rb }, Kernel::QmmCoopMoe { tb, rb }]);
        let kernels = kernels.chain([1, 2].map(|tb| Kernel::QmmCoopGlu { tb }));
        let kernels = kernels.chain(
            [64, 128, 256, 512].into_iter().flat_map(|d| [false, true].map(|sums| Kernel::AttentionCoop { d, sums })),
        );
        for k in kernels {
            let src = kernel_source(k, 32);
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
