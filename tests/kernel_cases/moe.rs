//! The mixture-of-experts kernels: the routed experts' mat-vecs and mat-mats on [`MoeMatmulCase`]
//! (`moe_matmul` per pair in every format, `moe_matmul_grouped` over `moe_group`'s lists, the
//! 4-bit forms the backend runs: `qmv_moe` for decode and verify, `qmm_moe` for chunks, its
//! tensor-core form in `qmm.rs`'s ignored test), `moe_group`, `moe_combine`, and the block's
//! fused forms: `qmv_moe_glu` (gate_up with the GeGLU epilogue) and `moe_norm` (the close).

use super::*;
use kestrel::kernels::*;

// ---------------------------------------------------------------------------------------------
// moe_matmul

/// `y[t, j, r] = W[idx[t, j] · expert_stride + row_off + r] · x[t · x_tok_stride + j · x_slot_stride]`
/// over an expert stack of `experts · expert_stride` rows; y_stride = rows + y_pad.
#[derive(Clone, Copy)]
pub struct MoeMatmulCase {
    pub fmt: Format,
    pub experts: usize,
    pub top_k: usize,
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub gs: usize,
    /// Split gate/up/down: rows; HF's fused gate_up: 2·rows.
    pub expert_stride: usize,
    /// Fused gate_up: 0 (gate) or rows (up).
    pub row_off: usize,
    /// false: gate/up (x shared by the slots: x_slot_stride 0, x_tok_stride cols);
    /// true: down (each slot's own activation: x_slot_stride cols, x_tok_stride top_k·cols).
    pub per_slot: bool,
    pub y_pad: usize,
    /// The prefill form: moe_group's lists (computed here) drive moe_matmul_grouped.
    pub grouped: bool,
    /// The 4-bit decode form the backend runs (qmv_moe.wgsl) instead of moe_matmul.
    pub qmv: bool,
    /// With `grouped`: the 4-bit prefill form the backend runs (qmm_moe.wgsl).
    pub qmm: bool,
    /// With `qmm`: its tensor-core form (qmm_coop_moe.wgsl) with this tile (TB, RB) instead.
    pub coop: Option<(u32, u32)>,
    /// Every third pair SKIP (another round of a streamed step): its rows must stay untouched.
    pub skips: bool,
    /// With `qmv`: the float loop (`Tuning::qmv_digits` off) instead of the integer digits.
    pub floats: bool,
}

/// moe_group's output for `idx`: per group, the count then the ascending pair indices.
pub fn group_lists(idx: &[u32], n_groups: usize, stride: usize) -> Vec<u32> {
    let mut g = vec![0u32; n_groups * stride];
    for s in 0..n_groups {
        let pairs: Vec<u32> = (0..idx.len() as u32).filter(|&p| idx[p as usize] == s as u32).collect();
        g[s * stride] = pairs.len() as u32;
        g[s * stride + 1..][..pairs.len()].copy_from_slice(&pairs);
    }
    g
}

/// Router-like expert choices: distinct per token where top_k ≤ experts; slot 0 of every token
/// after the first repeats the previous token's last expert; the last expert is used.
pub fn route(rng: &mut Rng, experts: usize, top_k: usize, tokens: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = Vec::with_capacity(tokens * top_k);
    for t in 0..tokens {
        let mut set = vec![if t == 0 { experts - 1 } else { idx[t * top_k - 1] as usize }];
        while set.len() < top_k {
            let e = rng.below(experts);
            if top_k > experts || !set.contains(&e) {
                set.push(e);
            }
        }
        idx.extend(set.iter().map(|&e| e as u32));
    }
    idx
}

impl MoeMatmulCase {
    /// Split layout, gate/up input mode.
    pub fn new(fmt: Format, experts: usize, top_k: usize, rows: usize, cols: usize, tokens: usize) -> Self {
        let gs = if is_quant(fmt) { 64 } else { 0 };
        MoeMatmulCase {
            fmt,
            experts,
            top_k,
            rows,
            cols,
            tokens,
            gs,
            expert_stride: rows,
            row_off: 0,
            per_slot: false,
            y_pad: 0,
            grouped: false,
            qmv: false,
            qmm: false,
            coop: None,
            skips: false,
            floats: false,
        }
    }
    pub fn grouped(self) -> Self {
        MoeMatmulCase { grouped: true, ..self }
    }
    /// The up half of a fused gate_up.
    pub fn fused_up(self) -> Self {
        MoeMatmulCase { expert_stride: 2 * self.rows, row_off: self.rows, ..self }
    }
    pub fn x_strides(&self) -> (usize, usize) {
        if self.per_slot {
            (self.top_k * self.cols, self.cols)
        } else {
            (self.cols, 0)
        }
    }
}

impl Case for MoeMatmulCase {
    fn kernel(&self) -> Kernel {
        self.form().0
    }

    fn name(&self) -> String {
        let c = self;
        let (xt, xs) = c.x_strides();
        let kind = match c.coop {
            Some((tb, rb)) if c.grouped && c.qmm => format!("qmm_coop_moe_{}x{}", 32 * rb, 64 * tb),
            _ if c.grouped && c.qmm => "qmm_moe".into(),
            _ if c.grouped => "moe_matmul_grouped".into(),
            _ if c.qmv => "qmv_moe".into(),
            _ => "moe_matmul".into(),
        };
        let mut s = format!(
            "{kind}_{}(experts={},top_k={},rows={},cols={},tokens={}",
            c.fmt.name(),
            c.experts,
            c.top_k,
            c.rows,
            c.cols,
            c.tokens
        );
        if is_quant(c.fmt) {
            s += &format!(",gs={}", c.gs);
        }
        s += &format!(",expert_stride={},row_off={},x_tok_stride={xt},x_slot_stride={xs}", c.expert_stride, c.row_off);
        if c.y_pad > 0 {
            s += &format!(",y_stride={}", c.rows + c.y_pad);
        }
        if c.skips {
            s += ",skips";
        }
        if c.floats {
            s += ",floats";
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &MoeMatmulCase { fmt, experts, top_k, rows, cols, tokens, gs, expert_stride, row_off, y_pad, .. } = self;
        let w = Weights::new(fmt, experts * expert_stride, cols, gs, rng, want);
        let mut idx = route(rng, experts, top_k, tokens);
        if self.skips {
            idx.iter_mut().step_by(3).for_each(|e| *e = u32::MAX);
        }
        let (x_tok, x_slot) = self.x_strides();
        let x = rng.vec(tokens * x_tok);
        let y_stride = rows + y_pad;
        let want_y = want.then(|| {
            let mut want = vec![None; tokens * top_k * y_stride];
            let mut row = vec![0.0f32; cols];
            for t in 0..tokens {
                for j in 0..top_k {
                    if idx[t * top_k + j] == u32::MAX {
                        continue;
                    }
                    let e = idx[t * top_k + j] as usize;
                    let xs = &x[t * x_tok + j * x_slot..][..cols];
                    for r in 0..rows {
                        w.matrix().row_f32(e * expert_stride + row_off + r, &mut row);
                        let s: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                        want[(t * top_k + j) * y_stride + r] = Some(s);
                    }
                }
            }
            want
        });
        let [wb, sb, bb] = w.part(0, experts * expert_stride);
        // Room for every token in each list, plus one spare word (must stay unread).
        let group_stride = tokens + 2;
        let mut bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            if self.grouped {
                input_words("groups", &group_lists(&idx, experts, group_stride))
            } else {
                input_words("idx", &idx)
            },
            input_words("x", &bits(&x)),
            output_f32("y", vec![POISON; tokens * top_k * y_stride], want_y, tol::DOT),
        ];
        if self.coop.is_some() {
            // Per token, or per pair where each slot has its own x row.
            let sums = if x_slot == 0 {
                group_sums(&x, tokens, x_tok, cols, gs)
            } else {
                group_sums(&x, tokens * top_k, x_slot, cols, gs)
            };
            bufs.push(input_words("xsum", &bits(&sums)));
        }
        let p = MoeMatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: gs as u32,
            expert_stride: expert_stride as u32,
            row_off: row_off as u32,
            top_k: top_k as u32,
            x_tok_stride: x_tok as u32,
            x_slot_stride: x_slot as u32,
            y_stride: y_stride as u32,
            group_stride: group_stride as u32,
            ..Default::default()
        };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let (kernel, per_wg) = self.form();
        if let (true, true, Some((tb, _))) = (self.grouped, self.qmm, self.coop) {
            // (n_groups · ceil(rows / BM), ceil(n_tokens / BN)), as the backend launches it.
            let p = MoeMatmulParams { n_groups: experts as u32, ..p };
            let x = experts * rows.div_ceil(per_wg as usize);
            return launch(kernel, bufs, &p, step, (x, tokens.div_ceil(64 * tb as usize)));
        }
        if self.grouped && self.qmm {
            // (n_groups · ceil(rows / 64), ceil(n_tokens / 64)), as the backend launches it.
            let p = MoeMatmulParams { n_groups: experts as u32, ..p };
            let x = experts * rows.div_ceil(per_wg as usize);
            return launch(kernel, bufs, &p, step, (x, tokens.div_ceil(QMM_TOK as usize)));
        }
        if self.grouped {
            // GridY::Fixed(n_groups): (ceil(rows / 4), experts, 1).
            return launch(kernel, bufs, &p, step, (rows.div_ceil(per_wg as usize), experts));
        }
        // GridY::Slots: (ceil(rows / rows per workgroup), top_k, n_tokens).
        let mut l = launch(kernel, bufs, &p, step, (rows.div_ceil(per_wg as usize), top_k));
        l.grid.2 = tokens as u32;
        l
    }
}

impl MoeMatmulCase {
    /// The kernel and the rows (of one expert) one workgroup covers.
    pub fn form(&self) -> (Kernel, u32) {
        let &MoeMatmulCase { fmt, rows, cols, top_k, .. } = self;
        match (self.grouped, self.qmm, self.coop) {
            (true, true, Some((tb, rb))) => (Kernel::QmmCoopMoe { tb, rb }, 32 * rb),
            (true, true, None) => (Kernel::QmmMoe, 16 * QMM_MOE_TM),
            (true, false, _) => (Kernel::MoeMatmulGrouped(fmt), MATMUL_ROWS),
            (false, ..) if self.qmv => {
                let (x_tok, x_slot) = self.x_strides();
                let tuning = Tuning { qmv_digits: !self.floats, ..Tuning::default() };
                qmv_moe_shape(rows, cols, top_k, x_tok, x_slot, &tuning).expect("qmv_moe applies to this case")
            }
            (false, ..) => (Kernel::MoeMatmul(fmt), MATMUL_ROWS),
        }
    }
}

pub fn moe_matmul_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for fmt in [Format::Q4, Format::Q8, Format::Bf16, Format::F32] {
        // Partial row tiles (1, 7, 65) and exact ones (64); cols 64: one quantisation group and
        // 8 of 64 lanes busy; 320: 5 groups, 40 chunks. Both input modes, split and fused up.
        for experts in [2, 16] {
            for top_k in [1, 4] {
                for rows in [1, 7, 64, 65] {
                    for cols in [64, 320] {
                        for tokens in [1, 3] {
                            for per_slot in [false, true] {
                                let c = MoeMatmulCase {
                                    per_slot,
                                    ..MoeMatmulCase::new(fmt, experts, top_k, rows, cols, tokens)
                                };
                                v.push(Box::new(c));
                                v.push(Box::new(c.fused_up()));
                            }
                        }
                    }
                }
            }
        }
        // 26B-A4B widths (hidden 2816, expert width 704: 88 chunks, more than the 64 lanes), top 8:
        // the fused gate_up's gate and up halves, then down.
        let g = MoeMatmulCase::new(fmt, 9, 8, 9, 2816, 3);
        v.push(Box::new(MoeMatmulCase { expert_stride: 18, ..g }));
        v.push(Box::new(g.fused_up()));
        v.push(Box::new(MoeMatmulCase { per_slot: true, ..MoeMatmulCase::new(fmt, 9, 8, 9, 704, 3) }));
        // A y row wider than rows: the padding must stay untouched.
        v.push(Box::new(MoeMatmulCase { y_pad: 5, ..MoeMatmulCase::new(fmt, 16, 4, 7, 320, 3).fused_up() }));
        if is_quant(fmt) {
            v.push(Box::new(MoeMatmulCase { gs: 128, per_slot: true, ..MoeMatmulCase::new(fmt, 4, 4, 65, 512, 3) }));
        }
        // The prefill form: batches of 8 pairs per expert (1, 9 and 19 tokens: partial, one and
        // three batches), empty experts, both input modes, fused up, the 26B widths.
        for experts in [3, 16] {
            for top_k in [1, 2] {
                for rows in [1, 7, 65] {
                    for tokens in [1, 9, 19] {
                        for per_slot in [false, true] {
                            let c =
                                MoeMatmulCase { per_slot, ..MoeMatmulCase::new(fmt, experts, top_k, rows, 64, tokens) }
                                    .grouped();
                            v.push(Box::new(c));
                            v.push(Box::new(c.fused_up()));
                        }
                    }
                }
            }
        }
        v.push(Box::new(MoeMatmulCase::new(fmt, 9, 8, 9, 2816, 11).fused_up().grouped()));
        v.push(Box::new(
            MoeMatmulCase { per_slot: true, y_pad: 3, ..MoeMatmulCase::new(fmt, 9, 8, 9, 704, 11) }.grouped(),
        ));
    }
    // The 4-bit decode/verify form (qmv_moe): partial row blocks, both input modes, fused up,
    // SKIP pairs, group size 128, a padded y, the 26B widths (hidden 2816: 64 lanes; expert
    // width 704: 16 lanes, 22 chunks over 2 passes).
    let q = |experts, top_k, rows, cols, tokens| MoeMatmulCase {
        qmv: true,
        ..MoeMatmulCase::new(Format::Q4, experts, top_k, rows, cols, tokens)
    };
    for rows in [1, 7, 64, 65] {
        for per_slot in [false, true] {
            for skips in [false, true] {
                let c = MoeMatmulCase { per_slot, skips, ..q(16, 4, rows, 320, 3) };
                v.push(Box::new(c));
                v.push(Box::new(c.fused_up()));
            }
        }
    }
    v.push(Box::new(q(2, 1, 7, 64, 1)));
    v.push(Box::new(MoeMatmulCase { gs: 128, per_slot: true, ..q(4, 4, 65, 512, 3) }));
    v.push(Box::new(MoeMatmulCase { y_pad: 5, ..q(16, 4, 7, 320, 3).fused_up() }));
    v.push(Box::new(q(9, 8, 9, 2816, 3).fused_up()));
    v.push(Box::new(MoeMatmulCase { per_slot: true, skips: true, ..q(9, 8, 9, 704, 3) }));
    // The real 26B shapes (4 rows per team): gate_up 704 rows × 2816, down 2816 rows × 704.
    v.push(Box::new(q(9, 8, 704, 2816, 1).fused_up()));
    v.push(Box::new(MoeMatmulCase { per_slot: true, skips: true, ..q(9, 8, 2816, 704, 1) }));
    // The float loop (qmv_digits off), which takes the same rows where the digits would not fit
    // WebGPU's minimum workgroup memory: both input modes, fused up, SKIP pairs, the 26B widths.
    for per_slot in [false, true] {
        let c = MoeMatmulCase { per_slot, skips: per_slot, floats: true, ..q(16, 4, 65, 320, 3) };
        v.push(Box::new(c));
        v.push(Box::new(c.fused_up()));
    }
    v.push(Box::new(MoeMatmulCase { floats: true, ..q(9, 8, 9, 2816, 3).fused_up() }));
    v.push(Box::new(MoeMatmulCase { per_slot: true, floats: true, ..q(9, 8, 9, 704, 3) }));
    // The 4-bit prefill form (qmm_moe): partial row tiles, experts with no pairs, more pairs
    // than one 64-pair tile (tokens 70, top 2 of 3), both input modes, fused up, SKIP pairs,
    // group size 128, a padded y, the 26B widths.
    v.extend(qmm_moe_shapes(|experts, top_k, rows, cols, tokens| MoeMatmulCase {
        qmm: true,
        ..MoeMatmulCase::new(Format::Q4, experts, top_k, rows, cols, tokens).grouped()
    }));
    v
}

/// moe_matmul_cases' prefill shapes for one form of the kernel (`m` makes its case of
/// experts, top_k, rows, cols, tokens).
pub fn qmm_moe_shapes(m: impl Fn(usize, usize, usize, usize, usize) -> MoeMatmulCase) -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for rows in [1, 65] {
        for tokens in [1, 9, 70] {
            for per_slot in [false, true] {
                let c = MoeMatmulCase { per_slot, ..m(16, 2, rows, 320, tokens) };
                v.push(Box::new(c));
                v.push(Box::new(c.fused_up()));
            }
        }
    }
    v.push(Box::new(MoeMatmulCase { skips: true, ..m(3, 2, 65, 320, 70) }));
    v.push(Box::new(MoeMatmulCase { gs: 128, per_slot: true, ..m(4, 4, 65, 512, 9) }));
    v.push(Box::new(MoeMatmulCase { y_pad: 5, ..m(16, 4, 7, 320, 9).fused_up() }));
    v.push(Box::new(m(9, 8, 9, 2816, 11).fused_up()));
    v.push(Box::new(MoeMatmulCase { per_slot: true, y_pad: 3, ..m(9, 8, 9, 704, 11) }));
    v
}

// ---------------------------------------------------------------------------------------------
// moe_group

/// `groups[s]` = count, then the ascending pairs p with `idx[p] == s`; SKIP pairs match nothing.
#[derive(Clone, Copy)]
pub struct GroupCase {
    pub groups: usize,
    pub top_k: usize,
    pub tokens: usize,
    /// Mark every third pair SKIP (another round of a streamed step).
    pub skips: bool,
}

impl Case for GroupCase {
    fn kernel(&self) -> Kernel {
        Kernel::MoeGroup
    }

    fn name(&self) -> String {
        format!("moe_group(groups={},top_k={},tokens={},skips={})", self.groups, self.top_k, self.tokens, self.skips)
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &GroupCase { groups, top_k, tokens, skips } = self;
        let mut idx = route(rng, groups, top_k, tokens);
        if skips {
            idx.iter_mut().step_by(3).for_each(|e| *e = u32::MAX);
        }
        let stride = tokens + 2;
        // Only the count and the listed pairs are specified; the rest of each list stays poison.
        let want_g = want.then(|| {
            let lists = group_lists(&idx, groups, stride);
            let mut want = vec![None; groups * stride];
            for s in 0..groups {
                let n = lists[s * stride] as usize;
                for i in 0..=n {
                    want[s * stride + i] = Some(lists[s * stride + i]);
                }
            }
            want
        });
        let bufs = vec![input_words("idx", &idx), output_u32("groups", vec![POISON; groups * stride], want_g)];
        let p = GroupParams { top_k: top_k as u32, stride: stride as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(self.kernel(), bufs, &p, step, (groups, 1))
    }
}

pub fn group_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    // Pair counts below, at and across the 64-wide scan blocks (1·1 … 128·8).
    for (groups, top_k, tokens) in [(1, 1, 1), (4, 2, 3), (16, 4, 16), (16, 4, 17), (128, 8, 128), (7, 1, 200)] {
        for skips in [false, true] {
            v.push(Box::new(GroupCase { groups, top_k, tokens, skips }));
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// moe_combine

/// `out[t, r] = Σ_j weight[t, j] · src[t, j, r]` over the token's top_k slots.
#[derive(Clone, Copy)]
pub struct CombineCase {
    pub n: usize,
    pub top_k: usize,
    pub tokens: usize,
}

impl Case for CombineCase {
    fn kernel(&self) -> Kernel {
        Kernel::MoeCombine
    }

    fn name(&self) -> String {
        format!("moe_combine(n={},top_k={},tokens={})", self.n, self.top_k, self.tokens)
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &CombineCase { n, top_k, tokens } = self;
        let wt = rng.vec(tokens * top_k);
        let src = rng.vec(tokens * top_k * n);
        let want_out = want.then(|| {
            let mut want = vec![None; tokens * n];
            for t in 0..tokens {
                for r in 0..n {
                    // f64, in slot order.
                    let mut s = 0.0f64;
                    for j in 0..top_k {
                        s += wt[t * top_k + j] as f64 * src[(t * top_k + j) * n + r] as f64;
                    }
                    want[t * n + r] = Some(s);
                }
            }
            want
        });
        let bufs = vec![
            input_words("weight", &bits(&wt)),
            input_words("src", &bits(&src)),
            output_f32("out", vec![POISON; tokens * n], want_out, tol::DOT),
        ];
        let p = CombineParams { n: n as u32, top_k: top_k as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(self.kernel(), bufs, &p, step, (n.div_ceil(64), tokens))
    }
}

pub fn combine_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for n in [1, 64, 130] {
        for top_k in [1, 4, 8] {
            for tokens in [1, 5] {
                v.push(Box::new(CombineCase { n, top_k, tokens }));
            }
        }
    }
    // 26B-A4B: hidden 2816, top 8.
    v.push(Box::new(CombineCase { n: 2816, top_k: 8, tokens: 3 }));
    v
}

/// The prefill expert kernel computes each pair exactly as the per-pair moe_matmul does (same
/// chunking, same sums, same tree): their outputs must be bitwise equal. (4-bit experts decode
/// through qmv_moe instead, whose arithmetic differs: there, as for dense 4-bit matrices, a
/// chunk's logits agree with token-by-token decoding within tolerance, not bitwise.)
#[test]
fn grouped_expert_kernel_is_bitwise_the_decode_kernel() {
    crate::each_runner(|h| {
        for fmt in [Format::Q4, Format::Q8, Format::Bf16, Format::F32] {
            for c in [
                MoeMatmulCase::new(fmt, 16, 4, 65, 320, 19).fused_up(),
                MoeMatmulCase { per_slot: true, ..MoeMatmulCase::new(fmt, 9, 8, 9, 704, 11) },
            ] {
                let outs: Vec<Vec<u8>> = [c, c.grouped()]
                    .iter()
                    .map(|case| {
                        let l = case.build(&mut Rng::new(7), Want::Reference);
                        let bufs: Vec<Vec<u8>> = l.buffers();
                        let out = h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap();
                        out.last().unwrap().clone()
                    })
                    .collect();
                assert!(outs[0] == outs[1], "{}: grouped output differs from the per-pair kernel", c.name());
            }
        }
    });
}

/// The same for the routed experts' loop on integer digits (qmv_moe.wgsl with qmv_digits.wgsl,
/// the 26B's 2816-wide gate/up input shared by the slots): every row of a token whose x holds an
/// inf or a NaN is non-finite, the other token's rows are unchanged.
#[test]
fn qmv_moe_digit_rows_carry_a_non_finite_x() {
    crate::each_runner(|h| {
        let c = MoeMatmulCase { qmv: true, ..MoeMatmulCase::new(Format::Q4, 9, 8, 9, 2816, 3) };
        let l = c.build(&mut Rng::new(5), Want::Reference);
        assert!(l.kernel.label().ends_with("_i"), "{} is not the digits form", l.kernel.label());
        let mut bufs: Vec<Vec<u8>> = l.buffers();
        let per_token = 8 * 9; // top_k slots × rows
        let clean = f32s(&h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[5]);
        assert!(clean[..3 * per_token].iter().all(|v| v.is_finite()), "non-finite rows from a finite x");
        // Token 0: +inf at column 40; token 1: NaN at column 1000; token 2 untouched.
        bufs[4][4 * 40..4 * 41].copy_from_slice(&f32::INFINITY.to_le_bytes());
        bufs[4][4 * (2816 + 1000)..4 * (2816 + 1001)].copy_from_slice(&f32::NAN.to_le_bytes());
        let got = f32s(&h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[5]);
        for t in 0..2 {
            let finite = got[t * per_token..(t + 1) * per_token].iter().filter(|v| v.is_finite()).count();
            assert_eq!(finite, 0, "token {t}: {finite} of {per_token} rows finite with a non-finite x");
        }
        let changed = (2 * per_token..3 * per_token).filter(|&i| got[i].to_bits() != clean[i].to_bits()).count();
        assert_eq!(changed, 0, "token 2's rows changed");
    });
}

/// qmv_moe_glu (fused gate_up experts, GeGLU epilogue) against the CPU reference
/// `gelu_tanh(G_e x) · (U_e x)`: the 26B expert width (704 rows × 2816 cols, 8 of 128 slots),
/// a partial team block (rows 70), several tokens with a SKIP pair left untouched.
#[test]
fn moe_glu_matches_the_cpu_reference() {
    use kestrel::reference;
    crate::each_runner(|h| {
        // (experts, top_k, rows, cols, tokens)
        // The digit loop, then the float loop (qmv_digits off).
        let shapes = [
            (16, 8, 704, 2816, 1, true),
            (5, 3, 70, 256, 3, true),
            (16, 8, 704, 2816, 1, false),
            (5, 3, 70, 256, 3, false),
        ];
        for (experts, top_k, rows, cols, tokens, digits) in shapes {
            let mut rng = Rng::new((rows * 7 + cols) as u64);
            let stride = 2 * rows;
            let w = Weights::new(Format::Q4, experts * stride, cols, 64, &mut rng, Want::Reference);
            let xs = rng.vec(tokens * cols);
            let mut idx: Vec<u32> = (0..tokens * top_k).map(|i| ((i * 7 + 3) % experts) as u32).collect();
            if tokens > 1 {
                idx[1] = u32::MAX; // SKIP: a pair of another streaming round
            }
            let y_ref = reference::matmul(w.matrix(), &xs, tokens); // [t, experts · stride]
            let mut want = vec![None; tokens * top_k * rows];
            for t in 0..tokens {
                for j in 0..top_k {
                    let e = idx[t * top_k + j];
                    if e == u32::MAX {
                        continue;
                    }
                    for r in 0..rows {
                        let base = t * experts * stride + e as usize * stride;
                        let (g, u) = (y_ref[base + r], y_ref[base + rows + r]);
                        want[(t * top_k + j) * rows + r] = Some(reference::gelu_tanh(g) as f64 * u as f64);
                    }
                }
            }
            let [wb, sb, bb] = w.part(0, experts * stride);
            let p = MoeMatmulParams {
                rows: rows as u32,
                cols: cols as u32,
                gs: 64,
                expert_stride: stride as u32,
                row_off: 0,
                top_k: top_k as u32,
                x_tok_stride: cols as u32,
                x_slot_stride: 0,
                y_stride: rows as u32,
                up_off: rows as u32,
                ..Default::default()
            };
            let tuning = Tuning { qmv_digits: digits, ..Tuning::default() };
            let (kernel, per_wg) = qmv_moe_glu_shape(rows, cols, top_k, cols, 0, &tuning).expect("applies");
            let step =
                Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
            let poison = vec![POISON; tokens * top_k * rows];
            let bufs = [wb, sb, bb, to_bytes(&idx), to_bytes(&bits(&xs)), to_bytes(&poison)];
            let out = h
                .run(
                    kernel,
                    &bufs,
                    bytemuck::bytes_of(&p),
                    step,
                    ((rows as u32).div_ceil(per_wg), top_k as u32, tokens as u32),
                )
                .unwrap();
            let got = words(&out[5]);
            let case =
                format!("{}(experts={experts},top_k={top_k},rows={rows},cols={cols},tokens={tokens})", kernel.label());
            let (mut g, mut r) = (Vec::new(), Vec::new());
            for (i, want) in want.iter().enumerate() {
                match want {
                    Some(v) => {
                        g.push(f32::from_bits(got[i]));
                        r.push(*v);
                    }
                    None => assert_eq!(got[i], POISON, "{case}: a SKIP pair's row {i} was written"),
                }
            }
            match compare(&g, &r, tol::DOT) {
                Ok(nmse) => println!("{case} [{}]: y NMSE {nmse:.1e} OK", h.backend()),
                Err(e) => panic!("{case}: {e}"),
            }
        }
    });
}

/// moe_norm (decode and verify steps close a MoE block in one dispatch) writes what the three
/// dispatches chunks still run write — rmsnorm mode 0 of the dense row, moe_combine, and
/// rmsnorm mode 1 of the experts' sum onto it — and matches an f64 reference (tolerance: two
/// norms over K-term sums, tol::NORM): the 26B's row (2816 values, top 8) for one and three
/// tokens, a row shorter than the workgroup with top 2, and E2B's width with top 4.
/// Against the three dispatches: the same operations in the same order, bitwise on lavapipe;
/// on the H200 not bitwise (the driver may contract a multiply and the add after it into one
/// FMA in one kernel and not in the other, as SPIR-V allows: NMSE ≤ 4.6e-15 there, ledger:
/// 2026-12-02 moe-norm-nmse), so within tol::SAME_OPS.
#[test]
fn moe_norm_matches_its_three_dispatches() {
    crate::each_runner(|h| {
        let max_wg = h.limits().max_threads;
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let small = || vec![0u8; 16];
        for (n, k, tokens) in [(2816usize, 8usize, 1usize), (2816, 8, 3), (100, 2, 2), (1536, 4, 1)] {
            let what = format!("n {n}, top {k}, {tokens} token(s)");
            let mut rng = Rng::new(seed_of(&format!("moe_norm {what}")));
            let (dense, eo, wts, wt) =
                (rng.vec(tokens * n), rng.vec(tokens * k * n), rng.vec(tokens * k), rng.vec(3 * n));
            let eps = 1e-6f32;
            let step =
                Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
            // The three dispatches: the weights of the two norms at n and 2n, the norms on
            // moe_norm's threads and registers (its sums in their order).
            let one = moe_norm(n, k, max_wg, &Tuning::default());
            let Kernel::MoeNorm { v, wg, .. } = one else { panic!("moe_norm returned {one:?}") };
            let norm = Kernel::RmsNorm { v, wg };
            let plain = |w_off: usize, mode: u32| NormParams {
                n: n as u32,
                segs: 1,
                x_stride: n as u32,
                out_stride: n as u32,
                w_off: w_off as u32,
                mode,
                pre: 1.0,
                post: 1.0,
                eps,
                ..Default::default()
            };
            let norm_bufs = |x: &[u8], out: &[u8]| {
                vec![x.to_vec(), bytes(&wt), out.to_vec(), small(), small(), small(), small(), small(), small()]
            };
            let m1 = h
                .run(
                    norm,
                    &norm_bufs(&bytes(&dense), &vec![0u8; 4 * tokens * n]),
                    bytemuck::bytes_of(&plain(n, 0)),
                    step,
                    (1, tokens as u32, 1),
                )
                .unwrap()
                .swap_remove(2);
            let cp = CombineParams { n: n as u32, top_k: k as u32, _pad: [0; 2] };
            let o = h
                .run(
                    Kernel::MoeCombine,
                    &[bytes(&wts), bytes(&eo), vec![0u8; 4 * tokens * n]],
                    bytemuck::bytes_of(&cp),
                    step,
                    ((n as u32).div_ceil(64), tokens as u32, 1),
                )
                .unwrap()
                .swap_remove(2);
            let want = h
                .run(norm, &norm_bufs(&o, &m1), bytemuck::bytes_of(&plain(2 * n, 1)), step, (1, tokens as u32, 1))
                .unwrap()
                .swap_remove(2);
            // The one.
            let mp = MoeNormParams {
                n: n as u32,
                w1_off: n as u32,
                w2_off: 2 * n as u32,
                eps,
                post1: 1.0,
                post2: 1.0,
                _pad: [0; 2],
            };
            let bufs = [bytes(&dense), bytes(&eo), bytes(&wts), bytes(&wt), vec![0u8; 4 * tokens * n]];
            let got = h.run(one, &bufs, bytemuck::bytes_of(&mp), step, (1, tokens as u32, 1)).unwrap().swap_remove(4);
            let as_f32 = |b: &[u8]| -> Vec<f32> { words(b).into_iter().map(f32::from_bits).collect() };
            let chain: Vec<f64> = as_f32(&want).into_iter().map(f64::from).collect();
            match compare(&as_f32(&got), &chain, tol::SAME_OPS) {
                Ok(nmse) => {
                    let same = words(&got).iter().zip(words(&want)).filter(|(a, b)| **a == *b).count();
                    println!(
                    "moe_norm {what} [{}]: NMSE {nmse:.1e} against the three dispatches, {same} of {} values bitwise",
                    h.backend(),
                    tokens * n
                );
                }
                Err(e) => panic!("{what} [{}]: moe_norm against the three dispatches: {e}", h.backend()),
            }
            // The reference, in f64.
            let mut reference = vec![0f64; tokens * n];
            let rms = |v: &[f64]| 1.0 / (v.iter().map(|x| x * x).sum::<f64>() / n as f64 + eps as f64).sqrt();
            for t in 0..tokens {
                let d: Vec<f64> = dense[t * n..(t + 1) * n].iter().map(|&x| x as f64).collect();
                let m: Vec<f64> = (0..n)
                    .map(|i| (0..k).map(|j| wts[t * k + j] as f64 * eo[(t * k + j) * n + i] as f64).sum())
                    .collect();
                let (r1, r2) = (rms(&d), rms(&m));
                for i in 0..n {
                    reference[t * n + i] = d[i] * r1 * wt[n + i] as f64 + m[i] * r2 * wt[2 * n + i] as f64;
                }
            }
            let got: Vec<f32> = words(&got).into_iter().map(f32::from_bits).collect();
            if let Err(e) = compare(&got, &reference, tol::NORM) {
                panic!("{what} [{}]: moe_norm against the f64 reference: {e}", h.backend());
            }
        }
    });
}
