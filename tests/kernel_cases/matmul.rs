//! The mat-vecs and the generic mat-mat: `matmul` in every weight format (the prefill tile of 8
//! tokens, decode's 1, verify's 4), the 4-bit decode/verify mat-vec `qmv` and its forms (GeGLU
//! over a stacked gate/up matrix, the gated PLE form, the fused residual norm as prologue), and
//! the tests that hold decode and verify rows bitwise equal. The 4-bit prefill mat-mat (`qmm`)
//! shares [`MatmulCase`]; its cases are in `qmm.rs`.

use super::*;
use kestrel::kernels::runner::PARAMS2_AT;
use kestrel::kernels::*;
use kestrel::reference;

/// `y[t, y_off + r] = W[r] · x[t]`; defaults: x_stride = cols, y_off = 0, y_stride = rows,
/// count_sel 0 (count = tokens).
#[derive(Clone, Copy)]
pub struct MatmulCase {
    pub fmt: Format,
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub gs: usize,
    pub x_pad: usize,
    pub y_off: usize,
    pub y_pad: usize,
    /// Some(n): count_sel 1 (the LM head), count = step.n_out = n.
    pub n_out: Option<usize>,
    /// Token tile of the pipeline variant (`TOK` in matmul.wgsl): 1 (decode), 4 (verify) or 8 (chunks).
    pub tile: usize,
    /// Run the 4-bit mat-vec (qmv.wgsl, the backend's decode/verify variant for Q4) instead.
    pub qmv: bool,
    /// Run the 4-bit prefill mat-mat (qmm.wgsl, the backend's chunk variant for Q4) with this
    /// many rows per thread (TM) instead.
    pub qmm: Option<u32>,
    /// With `qmm`: its tensor-core form (qmm_coop.wgsl) with this tile (TB, RB) instead.
    pub coop: Option<(u32, u32)>,
    /// x values spread over 2^-20 … 2^19 inside each 32-value chunk, with exact zeros (the
    /// staged qmv loop keeps 22 bits below a chunk's largest |x|: its small values lose the most).
    pub x_spread: bool,
}

impl MatmulCase {
    pub fn new(fmt: Format, rows: usize, cols: usize, tokens: usize, gs: usize) -> Self {
        MatmulCase {
            fmt,
            rows,
            cols,
            tokens,
            gs: if is_quant(fmt) { gs } else { 0 },
            x_pad: 0,
            y_off: 0,
            y_pad: 0,
            n_out: None,
            tile: 8,
            qmv: false,
            qmm: None,
            coop: None,
            x_spread: false,
        }
    }

    /// The kernel and the rows one workgroup covers.
    pub fn form(&self) -> (Kernel, u32) {
        let &MatmulCase { fmt, cols, x_pad, tile, qmv, qmm, coop, rows, .. } = self;
        let x_stride = cols + x_pad;
        if qmv {
            qmv_shape(rows, cols, x_stride, tile as u32).expect("qmv applies to this case")
        } else if let Some(tm) = qmm {
            assert!(qmm_applies(fmt, cols, x_stride) && tile == QMM_TOK as usize);
            match coop {
                Some((tb, rb)) => (Kernel::QmmCoop { tb, rb }, 32 * rb),
                None => (Kernel::Qmm { tm }, 16 * tm),
            }
        } else {
            (Kernel::Matmul(fmt, tile as u32), matmul_rows(tile as u32))
        }
    }
}

impl Case for MatmulCase {
    fn name(&self) -> String {
        let c = self;
        let kind = match (c.qmv, c.qmm, c.coop) {
            (true, ..) => "qmv".to_string(),
            (false, Some(_), Some((tb, rb))) => format!("qmm_coop_{}x{}", 32 * rb, 64 * tb),
            (false, Some(tm), None) => format!("qmm_m{tm}"),
            (false, None, _) => "matmul".to_string(),
        };
        let mut s = format!("{kind}_{}_t{}(rows={},cols={},tokens={}", c.fmt.name(), c.tile, c.rows, c.cols, c.tokens);
        if is_quant(c.fmt) {
            s += &format!(",gs={}", c.gs);
        }
        if c.x_pad > 0 {
            s += &format!(",x_stride={}", c.cols + c.x_pad);
        }
        if c.y_off > 0 || c.y_pad > 0 {
            s += &format!(",y_off={},y_stride={}", c.y_off, c.y_off + c.rows + c.y_pad);
        }
        if c.x_spread {
            s += ",x_spread";
        }
        if let Some(n) = c.n_out {
            s += &format!(",count_sel=1,n_out={n}");
        }
        s + ")"
    }

    fn kernel(&self) -> Kernel {
        self.form().0
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &MatmulCase { fmt, rows, cols, tokens, gs, x_pad, y_off, y_pad, n_out, tile, coop, x_spread, .. } = self;
        let w = Weights::new(fmt, rows, cols, gs, rng, want);
        let count = n_out.unwrap_or(tokens);
        let (x_stride, y_stride) = (cols + x_pad, y_off + rows + y_pad);
        let mut xs = rng.vec(count * cols);
        if x_spread {
            for (i, v) in xs.iter_mut().enumerate() {
                *v = if i % 11 == 5 { 0.0 } else { *v * 2f32.powi((i * 7 % 40) as i32 - 20) };
            }
        }
        // Padding and the rows past `count` are poison: the kernel must not read them.
        let mut x = vec![POISON; tokens * x_stride];
        for t in 0..count {
            x[t * x_stride..t * x_stride + cols].copy_from_slice(&bits(&xs[t * cols..(t + 1) * cols]));
        }
        let want_y = want.then(|| {
            let y_ref = reference::matmul(w.matrix(), &xs, count);
            let mut want = vec![None; tokens * y_stride];
            for t in 0..count {
                for r in 0..rows {
                    want[t * y_stride + y_off + r] = Some(y_ref[t * rows + r] as f64);
                }
            }
            want
        });
        let [wb, sb, bb] = w.part(0, rows);
        let mut bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &x),
            output_f32("y", vec![POISON; tokens * y_stride], want_y, tol::DOT),
        ];
        if coop.is_some() {
            bufs.push(input_words("xsum", &bits(&group_sums(&xs, count, cols, cols, gs))));
        }
        let p = MatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: gs as u32,
            x_stride: x_stride as u32,
            y_stride: y_stride as u32,
            y_off: y_off as u32,
            count_sel: n_out.is_some() as u32,
            k_splits: 0,
        };
        let n_out_step = n_out.unwrap_or(1);
        let step = Step {
            n_tokens: tokens as u32,
            pos0: 0,
            n_out: n_out_step as u32,
            out_row0: (tokens - n_out_step) as u32,
            ..Default::default()
        };
        let (kernel, rows_per_wg) = self.form();
        let tok_tile = coop.map_or(tile, |(tb, _)| 64 * tb as usize);
        let grid = (rows.div_ceil(rows_per_wg as usize), count.div_ceil(tok_tile));
        let mut l = launch(kernel, bufs, &p, step, grid);
        if rows == 257 || rows == 1100 {
            // Fold x into x·z as the backend does past 65535 workgroups (here past 16): e.g. the
            // 65 row blocks of matmul become 17 × 4 (3 blocks past the end that must write
            // nothing), qmm's 18 (TM 4) or 9 (TM 8) blocks of 1100 rows 9 × 2 or 5 × 2. (A
            // benchmark at a real size folds past the device's limit: Launch::fold_x.)
            l.fold_x(16);
        }
        l
    }
}

pub fn matmul_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for fmt in [Format::Q4, Format::Q8, Format::Bf16, Format::F32] {
        // Awkward rows (partial row tiles) × tokens (partial token tiles); cols 320: 40 chunks of 8,
        // so 24 of the 64 lanes idle, and 5 quantisation groups.
        for rows in [1, 7, 63, 65, 257] {
            for tokens in [1, 3, 8, 9, 17] {
                v.push(Box::new(MatmulCase::new(fmt, rows, 320, tokens, 64)));
                // The decode variant (one token per workgroup), as the backend runs M = 1.
                if tokens <= 3 {
                    v.push(Box::new(MatmulCase { tile: 1, ..MatmulCase::new(fmt, rows, 320, tokens, 64) }));
                }
                // The speculative-verify variant (4-token tile, one row per workgroup).
                if tokens <= 9 {
                    v.push(Box::new(MatmulCase {
                        tile: MATMUL_VERIFY_TOK as usize,
                        ..MatmulCase::new(fmt, rows, 320, tokens, 64)
                    }));
                }
            }
        }
        // Real widths: E2B hidden 1536, E4B hidden 2560, E2B MLP 6144 (the down projection's cols).
        for (rows, cols, tokens) in [(9, 1536, 3), (5, 2560, 9), (3, 6144, 2)] {
            v.push(Box::new(MatmulCase::new(fmt, rows, cols, tokens, 64)));
        }
        // Narrow rows (fewer chunks than lanes).
        let narrow = if is_quant(fmt) { [64, 128] } else { [8, 24] };
        for cols in narrow {
            v.push(Box::new(MatmulCase::new(fmt, 7, cols, 3, 64)));
        }
        if is_quant(fmt) {
            v.push(Box::new(MatmulCase::new(fmt, 65, 512, 9, 128)));
        }
        // A later part of a split matrix (y_off, wider y_stride) reading a strided x.
        v.push(Box::new(MatmulCase { x_pad: 16, y_off: 70, y_pad: 13, ..MatmulCase::new(fmt, 63, 256, 9, 64) }));
        // The LM head: count = n_out (count_sel 1).
        for (tokens, n_out) in [(9, 1), (17, 9)] {
            v.push(Box::new(MatmulCase { n_out: Some(n_out), ..MatmulCase::new(fmt, 65, 256, tokens, 64) }));
        }
    }
    v.extend(qmv_cases());
    v.extend(glu_cases());
    v.extend(super::qmm::qmm_cases());
    v
}

/// The 4-bit mat-vec of decode (tile 1) and verify (tile 4) steps: every lane count of
/// `qmv_shape` (8: cols 320 → 10 chunks; 16: cols 1024; 32: cols 1536 → 48 chunks, so lanes idle
/// on the second pass; 64: cols 2560; 128: cols 6144), every rows-per-team (1; 2: rows 3000;
/// 4: rows 4100), the tall rules (16 lanes × 2 rows at 12300 rows, 16 × 8 at 12290 rows of
/// 16384 values, 8 × 4 for the LM head at 65536), x staged (34 chunks on 16 lanes, 20 on 8) and
/// not, x spread over 40 binades, partial row blocks, group size 128, a strided x, a later part,
/// count = n_out, a folded grid.
pub fn qmv_cases() -> Vec<Box<dyn Case>> {
    let q = |rows, cols, tokens, tile| MatmulCase {
        tile,
        qmv: true,
        ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64)
    };
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for tile in [1, MATMUL_VERIFY_TOK as usize] {
        for rows in [1, 7, 65, 257] {
            for tokens in [1, 3, 5] {
                if tile == 1 && tokens > 1 && rows != 65 {
                    continue;
                }
                v.push(Box::new(q(rows, 320, tokens, tile)));
            }
        }
        for (rows, cols) in [
            (33, 1536),
            (41, 2560),
            (9, 6144),
            (17, 1024),
            (3000, 2048),
            (4100, 2048),
            (12300, 1088),
            (65536, 64),
            (65536, 640),
        ] {
            v.push(Box::new(q(rows, cols, 2, tile)));
        }
        v.push(Box::new(MatmulCase { gs: 128, ..q(65, 512, 3, tile) }));
        // Chunks whose values span 40 binades (staged: 34 chunks on 16 lanes; 1088 cols).
        v.push(Box::new(MatmulCase { x_spread: true, ..q(12300, 1088, 2, tile) }));
        // The long-row rule: 16 lanes × 8 rows per team, 16 staging rounds.
        v.push(Box::new(q(12290, 16384, 1, tile)));
        v.push(Box::new(MatmulCase { x_pad: 16, y_off: 70, y_pad: 13, ..q(63, 256, 5, tile) }));
        for (tokens, n_out) in [(9, 1), (17, 5)] {
            v.push(Box::new(MatmulCase { n_out: Some(n_out), ..q(65, 256, tokens, tile) }));
        }
    }
    v
}

/// The decode/verify mat-vec of a stacked [gate; up] 4-bit matrix with the GeGLU epilogue
/// (qmv.wgsl, GeGLU form): `y[t, r] = gelu_tanh(G x[t]) · (U x[t])` for r < rows in rows `2 · rows`
/// apart (the up half of each y row must stay untouched), token tile `tile`.
#[derive(Clone, Copy)]
pub struct GluCase {
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub tile: usize,
    /// The prefill form on tensor cores (qmm_coop_glu.wgsl) instead of qmv_glu (`tile` unused).
    pub coop: bool,
}

impl Case for GluCase {
    fn name(&self) -> String {
        let kind = if self.coop { "qmm_coop_glu_q4".to_string() } else { format!("qmv_glu_q4_t{}", self.tile) };
        format!("{kind}(rows={},cols={},tokens={})", self.rows, self.cols, self.tokens)
    }

    fn kernel(&self) -> Kernel {
        self.form().0
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &GluCase { rows, cols, tokens, coop, .. } = self;
        let w = Weights::new(Format::Q4, 2 * rows, cols, 64, rng, want);
        let xs = rng.vec(tokens * cols);
        let y_stride = 2 * rows;
        // gelu(g)·u per output row, and (the tensor-core form) each token's sums of them over
        // 64-row groups.
        let groups = rows.div_ceil(64);
        let (want_y, want_s) = want
            .then(|| {
                let y_ref = reference::matmul(w.matrix(), &xs, tokens);
                let glu = |t: usize, r: usize| {
                    reference::gelu_tanh(y_ref[t * 2 * rows + r]) as f64 * y_ref[t * 2 * rows + rows + r] as f64
                };
                let mut want = vec![None; tokens * y_stride];
                for t in 0..tokens {
                    for r in 0..rows {
                        let (g, u) = (y_ref[t * 2 * rows + r], y_ref[t * 2 * rows + rows + r]);
                        want[t * y_stride + r] = Some(reference::gelu_tanh(g) as f64 * u as f64);
                    }
                }
                let mut want_s = vec![None; tokens * groups];
                for t in 0..tokens {
                    for g in 0..groups {
                        want_s[t * groups + g] = Some((g * 64..rows.min(g * 64 + 64)).map(|r| glu(t, r)).sum());
                    }
                }
                (want, want_s)
            })
            .unzip();
        let [wb, sb, bb] = w.part(0, 2 * rows);
        let mut bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &bits(&xs)),
            // gelu(g)·u: the dot products' error (tol::DOT) times |gelu'| ≤ 1.13, plus one product.
            output_f32("y", vec![POISON; tokens * y_stride], want_y, tol::DOT),
        ];
        if coop {
            bufs.push(input_words("xsum", &bits(&group_sums(&xs, tokens, cols, cols, 64))));
            // Each token's sums of y over 64-row groups (the last one partial where rows is no
            // multiple of 64): sums of ≤ 64 values carrying tol::DOT's error.
            bufs.push(output_f32("ysum", vec![POISON; tokens * groups], want_s, tol::DOT));
        }
        let p = MatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: 64,
            x_stride: cols as u32,
            y_stride: y_stride as u32,
            y_off: 0,
            count_sel: 0,
            k_splits: 0,
        };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let (kernel, per_wg, tok) = self.form();
        launch(kernel, bufs, &p, step, (rows.div_ceil(per_wg as usize), tokens.div_ceil(tok)))
    }
}

impl GluCase {
    /// The kernel, the output rows one workgroup covers and its token tile.
    pub fn form(&self) -> (Kernel, u32, usize) {
        if self.coop {
            let (kernel, per_wg, tok) = qmm_coop_glu_shape();
            return (kernel, per_wg, tok as usize);
        }
        let (kernel, rows_per_wg) =
            qmv_glu_shape(self.rows, self.cols, self.cols, self.tile as u32, &Tuning::default())
                .expect("qmv_glu applies to this case");
        (kernel, rows_per_wg, self.tile)
    }
}

/// The fused-norm mat-vec (qmv.wgsl with qmv_norm.wgsl's prologue): per token,
/// `h = (res + norm(a) · w1) · post1` is written to res_out, and the plain or GeGLU mat-vec
/// multiplies `norm(h) · w2 · post2` (`second`) or `h`. The norm weights sit at odd offsets of
/// a wider buffer (as in the backend's one buffer of all norm weights).
#[derive(Clone, Copy)]
pub struct NormQmvCase {
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub tile: usize,
    pub second: bool,
    pub glu: bool,
    /// The float loop over the normed x (`Tuning::qmv_digits` off) instead of its integer digits.
    pub floats: bool,
}

impl Case for NormQmvCase {
    fn name(&self) -> String {
        let c = self;
        let form = if c.glu { "qmv_glu" } else { "qmv" };
        let floats = if c.floats { ",floats" } else { "" };
        format!(
            "{form}_norm_q4_t{}(rows={},cols={},tokens={},second={}{floats})",
            c.tile, c.rows, c.cols, c.tokens, c.second
        )
    }

    fn kernel(&self) -> Kernel {
        self.form().0
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &NormQmvCase { rows, cols, tokens, tile, second, glu, .. } = self;
        let w_rows = if glu { 2 * rows } else { rows };
        let w = Weights::new(Format::Q4, w_rows, cols, 64, rng, want);
        let (a, res) = (rng.vec(tokens * cols), rng.vec(tokens * cols));
        // Offsets past the buffer's start, multiples of 4 (read as vec4, the host aligns them).
        let (w1_off, w2_off) = (8, 8 + cols + 4);
        let nw: Vec<f32> = (0..w2_off + cols + 4).map(|_| 0.5 + 0.5 * (rng.uniform() + 1.0)).collect();
        let (post1, post2, eps) = (0.75f32, 1.25f32, 1e-6f32);
        let y_stride = w_rows;
        // The reference: rmsnorm (ops) in f64 sums, then the mat-vec of the normed rows.
        let (want_y, want_h) = want
            .then(|| {
                let mut hs = Vec::with_capacity(tokens * cols);
                let mut vs = Vec::with_capacity(tokens * cols);
                for t in 0..tokens {
                    let mut n1 = a[t * cols..(t + 1) * cols].to_vec();
                    reference::rmsnorm(&mut n1, Some(&nw[w1_off..w1_off + cols]), eps);
                    let h: Vec<f32> =
                        n1.iter().zip(&res[t * cols..(t + 1) * cols]).map(|(&n, &r)| (n + r) * post1).collect();
                    let mut v = h.clone();
                    if second {
                        reference::rmsnorm(&mut v, Some(&nw[w2_off..w2_off + cols]), eps);
                        v.iter_mut().for_each(|x| *x *= post2);
                    }
                    hs.extend(h);
                    vs.extend(v);
                }
                let y_ref = reference::matmul(w.matrix(), &vs, tokens);
                let mut want = vec![None; tokens * y_stride];
                for t in 0..tokens {
                    for r in 0..rows {
                        want[t * y_stride + r] = Some(if glu {
                            let (g, u) = (y_ref[t * 2 * rows + r], y_ref[t * 2 * rows + rows + r]);
                            reference::gelu_tanh(g) as f64 * u as f64
                        } else {
                            y_ref[t * rows + r] as f64
                        });
                    }
                }
                (want, hs.iter().map(|&v| Some(v as f64)).collect())
            })
            .unzip();
        let [wb, sb, bb] = w.part(0, w_rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("a", &bits(&a)),
            // The normed input's error (tol::NORM, relative ~1e-7 per value) passes through the
            // dot products as their own rounding does: tol::DOT covers both.
            output_f32("y", vec![POISON; tokens * y_stride], want_y, tol::DOT),
            input_words("res", &bits(&res)),
            input_words("norm weights", &bits(&nw)),
            output_f32("res_out", vec![POISON; tokens * cols], want_h, tol::NORM),
        ];
        let p = MatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: 64,
            x_stride: cols as u32,
            y_stride: y_stride as u32,
            y_off: 0,
            count_sel: 0,
            k_splits: 0,
        };
        let pro =
            NormPro { w1: w1_off as u32, post1, w2: w2_off as u32, post2, eps, second: second as u32, _pad: [0; 2] };
        let mut params = bytemuck::bytes_of(&p).to_vec();
        params.resize(PARAMS2_AT, 0);
        params.extend_from_slice(bytemuck::bytes_of(&pro));
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let (kernel, rows_per_wg) = self.form();
        let grid = (rows.div_ceil(rows_per_wg as usize) as u32, tokens.div_ceil(tile) as u32, 1);
        Launch { kernel, bufs, params, step, grid, then: None, post: None }
    }
}

impl NormQmvCase {
    /// The kernel and the output rows one workgroup covers.
    pub fn form(&self) -> (Kernel, u32) {
        let &NormQmvCase { rows, cols, tile, glu, floats, .. } = self;
        let tuning = Tuning { qmv_digits: !floats, ..Tuning::default() };
        let (kernel, rows_per_wg) = if glu {
            qmv_glu_shape(rows, cols, cols, tile as u32, &tuning)
        } else {
            qmv_shape(rows, cols, cols, tile as u32)
        }
        .expect("qmv applies to this case");
        let kernel = with_norm(kernel, tile as u32, cols, 32768, &tuning)
            .expect("the fused form fits in lavapipe's workgroup memory");
        (kernel, rows_per_wg)
    }
}

pub fn norm_qmv_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for (rows, cols) in [(65, 320), (40, 1536), (33, 2816)] {
        for tile in [1, PRO_VERIFY_TOK as usize] {
            for second in [true, false] {
                for glu in [false, true] {
                    for floats in [false, true] {
                        v.push(Box::new(NormQmvCase { rows, cols, tokens: 3, tile, second, glu, floats }));
                    }
                }
            }
        }
    }
    v
}

/// The gated decode/verify mat-vec (qmv.wgsl, gated form): `y[t, r] = gelu_tanh(W x[t])[r] ·
/// gb[t · b_stride + b_off + r]`, gb a later slice of a wider buffer (Gemma 4's per-layer
/// input gate times that layer's per-layer input), token tile `tile`.
#[derive(Clone, Copy)]
pub struct GeluBCase {
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub tile: usize,
}

impl Case for GeluBCase {
    fn name(&self) -> String {
        format!("qmv_gelu_b_q4_t{}(rows={},cols={},tokens={})", self.tile, self.rows, self.cols, self.tokens)
    }

    fn kernel(&self) -> Kernel {
        self.form().0
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &GeluBCase { rows, cols, tokens, tile } = self;
        let w = Weights::new(Format::Q4, rows, cols, 64, rng, want);
        let xs = rng.vec(tokens * cols);
        let (b_stride, b_off) = (3 * rows + 5, rows + 2);
        let gb = rng.vec(tokens * b_stride);
        let want_y = want.then(|| {
            let y_ref = reference::matmul(w.matrix(), &xs, tokens);
            let mut want = vec![None; tokens * rows];
            for t in 0..tokens {
                for r in 0..rows {
                    want[t * rows + r] =
                        Some(reference::gelu_tanh(y_ref[t * rows + r]) as f64 * gb[t * b_stride + b_off + r] as f64);
                }
            }
            want
        });
        let [wb, sb, bb] = w.part(0, rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &bits(&xs)),
            // gelu(y)·b: the dot product's error (tol::DOT) times |gelu'| ≤ 1.13 and |b| < 1.
            output_f32("y", vec![POISON; tokens * rows], want_y, tol::DOT),
            input_words("gb", &bits(&gb)),
        ];
        let p = QmvGeluParams {
            m: MatmulParams {
                rows: rows as u32,
                cols: cols as u32,
                gs: 64,
                x_stride: cols as u32,
                y_stride: rows as u32,
                y_off: 0,
                count_sel: 0,
                k_splits: 0,
            },
            b_stride: b_stride as u32,
            b_off: b_off as u32,
            _pad: [0; 2],
        };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let (kernel, rows_per_wg) = self.form();
        launch(kernel, bufs, &p, step, (rows.div_ceil(rows_per_wg as usize), tokens.div_ceil(tile)))
    }
}

impl GeluBCase {
    /// The kernel and the rows one workgroup covers.
    pub fn form(&self) -> (Kernel, u32) {
        qmv_gelu_b_shape(self.rows, self.cols, self.cols, self.tile as u32).expect("the gated qmv applies to this case")
    }
}

/// Partial team blocks (rows 1, 7, 65), one and two pairs per team (rows 3000 → 6000 stacked
/// rows), the lane counts of E2B/E4B widths (cols 1536, 2560) and the down-width 6144.
pub fn glu_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for tile in [1, MATMUL_VERIFY_TOK as usize] {
        for (rows, cols, tokens) in [
            (1, 320, 1),
            (7, 320, 3),
            (65, 320, 5),
            (3000, 256, 2),
            (6150, 1088, 2),
            (70, 1536, 1),
            (40, 2560, 3),
            (9, 6144, 2),
        ] {
            v.push(Box::new(GluCase { rows, cols, tokens, tile, coop: false }));
        }
        // The gated form: partial teams, E2B's per-layer gate (256 × 1536), E4B's width.
        for (rows, cols, tokens) in [(1, 320, 1), (7, 320, 3), (256, 1536, 2), (65, 2560, 5)] {
            v.push(Box::new(GeluBCase { rows, cols, tokens, tile }));
        }
    }
    v
}

/// A non-finite x makes its token's rows non-finite in the staged qmv loop too (its integer
/// digits of x cannot carry inf or NaN; the chunk's Σx, which every row multiplies by its bias,
/// does), and leaves the other tokens' rows as they were (12300 × 1088: 34 chunks on 16 lanes).
#[test]
fn qmv_staged_rows_carry_a_non_finite_x() {
    crate::each_runner(|r| {
        let c = MatmulCase { tile: 1, qmv: true, ..MatmulCase::new(Format::Q4, 12300, 1088, 3, 64) };
        let l = c.build(&mut Rng::new(5), Want::Reference);
        let mut bufs = l.buffers();
        let clean = f32s(&r.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[4]);
        assert!(clean[..3 * 12300].iter().all(|v| v.is_finite()), "non-finite rows from a finite x");
        // Token 0: +inf at column 40; token 1: NaN at column 1000; token 2 untouched.
        bufs[3][4 * 40..4 * 41].copy_from_slice(&f32::INFINITY.to_le_bytes());
        bufs[3][4 * (1088 + 1000)..4 * (1088 + 1001)].copy_from_slice(&f32::NAN.to_le_bytes());
        let got = f32s(&r.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[4]);
        for t in 0..2 {
            let finite = got[t * 12300..(t + 1) * 12300].iter().filter(|v| v.is_finite()).count();
            assert_eq!(finite, 0, "[{}] token {t}: {finite} of 12300 rows finite with a non-finite x", r.backend());
        }
        let changed: Vec<(usize, f32, f32)> = (2 * 12300..3 * 12300)
            .filter(|&i| got[i].to_bits() != clean[i].to_bits())
            .map(|i| (i, clean[i], got[i]))
            .take(5)
            .collect();
        assert!(changed.is_empty(), "[{}] token 2's rows changed: {changed:?}", r.backend());
    });
}

/// Decode and verify run different token tiles of qmv (1 for decode, 2–4 for a verify of as many
/// tokens): a row's result must not depend on the tile (the speculative path's logits are
/// bitwise a decode's).
#[test]
fn qmv_rows_are_bitwise_equal_across_token_tiles() {
    crate::each_runner(|r| {
        let b = r.backend().to_string();
        for (rows, cols) in [(65, 320), (33, 1536), (41, 2560), (12300, 1088)] {
            let outs: Vec<Vec<u8>> = (1..=MATMUL_VERIFY_TOK as usize)
                .map(|tile| {
                    let c = MatmulCase { tile, qmv: true, ..MatmulCase::new(Format::Q4, rows, cols, 3, 64) };
                    c.build(&mut Rng::new(11), Want::Reference).run(r).unwrap().swap_remove(4)
                })
                .collect();
            for (tile, o) in outs.iter().enumerate().skip(1) {
                assert!(outs[0] == *o, "[{b}] qmv rows={rows} cols={cols}: tile 1 and tile {} differ", tile + 1);
            }
        }
        // The GeGLU form: the same for its gate/up rows.
        for (rows, cols) in [(65, 320), (70, 1536), (6150, 1088)] {
            let outs: Vec<Vec<u8>> = (1..=MATMUL_VERIFY_TOK as usize)
                .map(|tile| {
                    let c = GluCase { rows, cols, tokens: 3, tile, coop: false };
                    c.build(&mut Rng::new(11), Want::Reference).run(r).unwrap().swap_remove(4)
                })
                .collect();
            for (tile, o) in outs.iter().enumerate().skip(1) {
                assert!(outs[0] == *o, "[{b}] qmv_glu rows={rows} cols={cols}: tile 1 and tile {} differ", tile + 1);
            }
        }
        // The fused-norm forms (their loop on the prologue's integer digits, qmv_digits.wgsl, or
        // with `floats` on the normed x itself): the normed input and the updated residual too.
        // At 1536 columns a lane's second chunk is clamped on its last round.
        for (glu, floats) in [(false, false), (true, false), (false, true), (true, true)] {
            for (rows, cols) in [(65, 320), (70, 1536), (40, 2816)] {
                let outs: Vec<(Vec<u8>, Vec<u8>)> = [1, PRO_VERIFY_TOK as usize]
                    .iter()
                    .map(|&tile| {
                        let c = NormQmvCase { rows, cols, tokens: 3, tile, second: true, glu, floats };
                        let out = c.build(&mut Rng::new(11), Want::Reference).run(r).unwrap();
                        (out[4].clone(), out[7].clone())
                    })
                    .collect();
                assert!(
                    outs[0] == outs[1],
                    "[{b}] fused-norm qmv (glu {glu}, floats {floats}) rows={rows} cols={cols}: tile 1 and tile {PRO_VERIFY_TOK} differ"
                );
            }
        }
    });
}
