//! The 4-bit prefill mat-mat (`qmm`, on [`MatmulCase`] with `qmm` set): its shapes in both row
//! tiles, split k (`qmm` over k ranges, then `qmm_sum`), the tensor-core forms (`qmm_coop`,
//! `qmm_coop_moe`, `qmm_coop_glu`: an ignored test, for devices with f16 cooperative matrices),
//! and `group_sum`, the pass that gives the tensor-core forms x's group sums.

use super::matmul::MatmulCase;
use super::*;
use kestrel::kernels::*;

/// The 4-bit prefill mat-mat: partial row and token tiles (rows 1, 63, 65, 130; tokens 1, 9, 64,
/// 65, 130), several 32-value steps per group (cols 320: 5 groups of 64, 10 steps) and group
/// size 128, a strided x, a later part, count = n_out (the LM head), a folded grid.
pub fn qmm_cases() -> Vec<Box<dyn Case>> {
    [4, 8]
        .into_iter()
        .flat_map(|tm| {
            qmm_shapes(|rows, cols, tokens| MatmulCase {
                tile: QMM_TOK as usize,
                qmm: Some(tm),
                ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64)
            })
        })
        .collect()
}

/// qmm_cases' shapes for one form of the kernel (`q` makes its case of rows × cols × tokens).
pub fn qmm_shapes(q: impl Fn(usize, usize, usize) -> MatmulCase) -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for rows in [1, 63, 65, 130] {
        for tokens in [1, 9, 64, 65, 130] {
            v.push(Box::new(q(rows, 320, tokens)));
        }
    }
    v.push(Box::new(q(257, 1536, 20)));
    v.push(Box::new(q(1100, 64, 3)));
    v.push(Box::new(MatmulCase { gs: 128, ..q(65, 512, 70) }));
    v.push(Box::new(MatmulCase { x_pad: 16, y_off: 70, y_pad: 13, ..q(63, 256, 9) }));
    for (tokens, n_out) in [(9, 1), (70, 66)] {
        v.push(Box::new(MatmulCase { n_out: Some(n_out), ..q(65, 256, tokens) }));
    }
    v
}

/// The split-k cases: (ranges, case).
pub fn split_k_cases() -> [(u32, MatmulCase); 5] {
    let q = |tm, rows, cols, tokens| MatmulCase {
        tile: QMM_TOK as usize,
        qmm: Some(tm),
        ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64)
    };
    [
        (2, q(4, 65, 512, 70)),
        (4, q(8, 130, 1024, 9)),
        (8, q(4, 63, 1536, 65)),
        (2, MatmulCase { x_pad: 16, y_off: 70, y_pad: 13, ..q(8, 63, 256, 9) }),
        (4, MatmulCase { n_out: Some(66), ..q(4, 65, 512, 70) }),
    ]
}

/// A qmm case's launch with its k loop split into `splits` ranges, as the backend runs few-row
/// matrices in chunks: `parts` (the mat-mat with k_splits > 1) writes each range's partial sums
/// where the unsplit launch has y, then `sum` (qmm_sum.wgsl) adds them into y; `sum`'s first
/// buffer is the partials, to be replaced by what `parts` left.
pub struct SplitK {
    pub parts: Dispatch,
    pub sum: Dispatch,
}

impl SplitK {
    /// `l` is case `c`'s launch.
    pub fn new(c: &MatmulCase, l: &Launch, splits: u32) -> SplitK {
        let p: MatmulParams = l.params_as();
        let count = c.n_out.unwrap_or(c.tokens);
        let scratch = vec![0u8; 4 * splits as usize * count * c.rows];
        let split_p = MatmulParams { y_stride: p.rows, y_off: 0, k_splits: splits, ..p };
        // w, scales, biases, x, the partials in y's place, then x's group sums (the tensor-core form).
        let buffers: Vec<Vec<u8>> = l.bufs[..4]
            .iter()
            .map(|b| b.bytes.clone())
            .chain([scratch.clone()])
            .chain(l.bufs[5..].iter().map(|b| b.bytes.clone()))
            .collect();
        let parts = Dispatch {
            kernel: l.kernel,
            buffers,
            params: bytemuck::bytes_of(&split_p).to_vec(),
            step: l.step,
            grid: (l.grid.0, l.grid.1 * splits, l.grid.2),
        };
        let sum = Dispatch {
            kernel: Kernel::QmmSum,
            buffers: vec![scratch, l.bufs[4].bytes.clone()],
            params: bytemuck::bytes_of(&MatmulParams { k_splits: splits, ..p }).to_vec(),
            step: l.step,
            grid: ((c.rows as u32).div_ceil(256), count as u32, 1),
        };
        SplitK { parts, sum }
    }

    /// Runs both on `r`: y (with its guard) as qmm_sum leaves it.
    pub fn run(mut self, r: &mut dyn KernelRunner) -> kestrel::Result<Vec<u8>> {
        let mut out = self.parts.run(r)?;
        self.sum.buffers[0] = out.swap_remove(4);
        Ok(self.sum.run(r)?.swap_remove(1))
    }
}

/// Runs case `c` split into `splits` k ranges, then qmm_sum, and checks y against the reference.
pub fn run_split_k(r: &mut dyn KernelRunner, splits: u32, c: MatmulCase) {
    let name = format!("{} k_splits={splits}", c.name());
    let l = c.build(&mut Rng::new(seed_of(&name)), Want::Reference);
    let Check::F32 { want, tol } = &l.bufs[4].check else { unreachable!("matmul's y is an f32 output") };
    let y = SplitK::new(&c, &l, splits).run(r).unwrap();
    // Every y value the reference leaves out must keep its poison (nothing written past the rows).
    let init: Vec<u32> = words(&l.bufs[4].bytes);
    untouched(&name, &words(&y), &init, want.len(), |i| want[i].is_some()).unwrap();
    let got = f32s(&y);
    let (g, w): (Vec<f32>, Vec<f64>) = want.iter().zip(&got).filter_map(|(w, &g)| w.map(|w| (g, w))).unzip();
    match compare(&g, &w, *tol) {
        Ok(nmse) => println!("{name} [{}]: y NMSE {nmse:.1e} OK", r.backend()),
        Err(e) => panic!("{name} [{}]: {e}", r.backend()),
    }
}

/// Split-k qmm (qmm.wgsl with k_splits > 1, then qmm_sum.wgsl), as the backend runs few-row
/// matrices in chunks, against the same CPU reference as the unsplit kernel: 2, 4 and 8 ranges,
/// both row tiles, partial row and token tiles, a later part of a strided y, count = n_out.
#[test]
fn split_k_qmm_matches_the_cpu_reference() {
    crate::each_runner(|r| {
        for (splits, c) in split_k_cases() {
            run_split_k(r, splits, c);
        }
    });
}

/// The tensor-core prefill mat-mats (qmm_coop.wgsl, qmm_coop_moe.wgsl, qmm_coop_glu.wgsl) on
/// qmm's and qmm_moe's cases, every tile, dense unsplit and split k, and GeGLU cases. Needs
/// a device with f16 cooperative matrices (the H200 through Vulkan, not lavapipe): ignored by
/// default, run there with `--include-ignored`, and failing, not passing, on a device without
/// them. Same tolerance as qmm: x split into two f16 halves and W exact in f16, with the bias
/// part from x's group sums ([`group_sums`]), leave ~2^-21 of each product (qmm_coop_core.wgsl),
/// far inside tol::DOT.
#[test]
#[ignore = "needs f16 cooperative matrices (tensor cores): run with --include-ignored on such a device"]
fn qmm_coop_matches_the_cpu_reference() {
    use super::matmul::GluCase;
    use super::moe::{qmm_moe_shapes, MoeMatmulCase};
    crate::each_runner(|r| {
        assert!(r.coop_f16(), "{} has no f16 cooperative matrices: qmm_coop cannot run here", r.describe());
        let tiles = [(1, 2), (2, 2), (1, 4), (2, 4)];
        let dense = tiles.into_iter().flat_map(|t| {
            qmm_shapes(move |rows, cols, tokens| MatmulCase {
                tile: QMM_TOK as usize,
                qmm: Some(4),
                coop: Some(t),
                ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64)
            })
        });
        let moe = tiles.into_iter().flat_map(|t| {
            let m = move |experts, top_k, rows, cols, tokens| MoeMatmulCase {
                qmm: true,
                coop: Some(t),
                ..MoeMatmulCase::new(Format::Q4, experts, top_k, rows, cols, tokens).grouped()
            };
            // Besides qmm_moe's shapes, the bias steps at group size 128: a block of 8 groups, then
            // a partial one whose unused slots must read as zeros.
            let mut v = qmm_moe_shapes(m);
            v.push(Box::new(MoeMatmulCase { gs: 128, ..m(4, 2, 65, 1280, 70) }));
            v
        });
        // The GeGLU form: partial row and token tiles, E2B/E4B widths.
        let glu = [(1, 320, 9), (65, 320, 130), (70, 1536, 257), (130, 2560, 20), (192, 256, 200)]
            .map(|(rows, cols, tokens)| Box::new(GluCase { rows, cols, tokens, tile: 0, coop: true }) as Box<dyn Case>);
        let failures = run_all(r, dense.chain(moe).chain(glu));
        assert!(failures.is_empty(), "{} qmm_coop case(s) failed:\n{}", failures.len(), failures.join("\n"));
        for ((splits, c), t) in split_k_cases().into_iter().zip(tiles.into_iter().cycle()) {
            run_split_k(r, splits, MatmulCase { coop: Some(t), ..c });
        }
    });
}

/// group_sum.wgsl: the sums of each quantisation group of x's rows, which the tensor-core
/// mat-mats read (their cases pass sums from [`group_sums`]; this checks the pass itself).
#[derive(Clone, Copy)]
pub struct GroupSumCase {
    pub tokens: usize,
    pub cols: usize,
    pub gs: usize,
    /// Values past `cols` in each x row (poison: never summed).
    pub pad: usize,
    /// x rows per token.
    pub mult: usize,
    /// count_sel = 1 with this many rows.
    pub n_out: Option<usize>,
}

impl Case for GroupSumCase {
    fn name(&self) -> String {
        let c = self;
        let mut s = format!(
            "group_sum(tokens={},cols={},gs={},stride={},mult={}",
            c.tokens,
            c.cols,
            c.gs,
            c.cols + c.pad,
            c.mult
        );
        if let Some(n) = c.n_out {
            s += &format!(",count_sel=1,n_out={n}");
        }
        s + ")"
    }

    fn kernel(&self) -> Kernel {
        Kernel::GroupSum
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &GroupSumCase { tokens, cols, gs, pad, mult, n_out } = self;
        let (count, stride, groups) = (n_out.unwrap_or(tokens), cols + pad, cols / gs);
        let vals = rng.vec(count * mult * cols);
        // Rows past count · mult and each row's padding are poison.
        let mut x = vec![POISON; tokens * mult * stride];
        for r in 0..count * mult {
            x[r * stride..r * stride + cols].copy_from_slice(&bits(&vals[r * cols..(r + 1) * cols]));
        }
        let want_s = want.then(|| {
            let mut want: Vec<Option<f64>> =
                group_sums_f64(&vals, count * mult, cols, cols, gs).into_iter().map(Some).collect();
            want.resize(tokens * mult * groups, None);
            want
        });
        // f32 sums of gs ≤ 128 terms in order (tol::DOT's argument).
        let bufs =
            vec![input_words("x", &x), output_f32("xsum", vec![POISON; tokens * mult * groups], want_s, tol::DOT)];
        let p = GroupSumParams {
            cols: cols as u32,
            gs: gs as u32,
            stride: stride as u32,
            mult: mult as u32,
            count_sel: n_out.is_some() as u32,
            ..Default::default()
        };
        let n_out_step = n_out.unwrap_or(1);
        let step = Step {
            n_tokens: tokens as u32,
            n_out: n_out_step as u32,
            out_row0: (tokens - n_out_step) as u32,
            ..Default::default()
        };
        launch(Kernel::GroupSum, bufs, &p, step, (group_sum_groups_x(mult * groups) as usize, count))
    }
}

pub fn group_sum_cases() -> Vec<Box<dyn Case>> {
    let c = |tokens, cols, gs, pad, mult| GroupSumCase { tokens, cols, gs, pad, mult, n_out: None };
    let v: Vec<GroupSumCase> = vec![
        c(1, 64, 64, 0, 1),
        c(9, 2560, 64, 0, 1),
        // More groups than one workgroup's 64 threads (E4B's down: 160), group size 128, padding.
        c(3, 10240, 64, 0, 1),
        c(5, 512, 128, 16, 1),
        // A routed expert's per-slot x: 8 rows per token of 11 groups (the 26B's 704).
        c(7, 704, 64, 0, 8),
        GroupSumCase { n_out: Some(2), ..c(9, 320, 64, 4, 1) },
    ];
    v.into_iter().map(|c| Box::new(c) as Box<dyn Case>).collect()
}
