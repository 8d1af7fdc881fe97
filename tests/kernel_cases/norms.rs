//! The norms: `rmsnorm` (decode and verify: one workgroup a row, residual modes, chained
//! norms, segments, the LM head's rows) and `rmsnorm_rows` (chunks: rows of vec4 on 64–256
//! threads, with the group sums the tensor-core mat-mats read, over split-k partials), and the
//! head norms with rope: `head_norm_rope` (q heads, k and v into ring caches) and
//! `qkv_norm_rope` (all three in one dispatch, held bitwise to three `head_norm_rope`s). The MoE
//! block's close (`moe_norm`) is in `moe.rs`.

use super::*;
use kestrel::config::Rope;
use kestrel::kernels::*;
use kestrel::reference;

// ---------------------------------------------------------------------------------------------
// rmsnorm

/// `out[t, s] = ((mode 1 ? out : 0) + norm(x[t', s] · pre) · w) · post`; defaults: segs 1,
/// pre = post = 1, weight at w_off 0, x_stride = out_stride = segs·n, x_row_sel = count_sel = 0.
#[derive(Clone, Copy)]
pub struct NormCase {
    pub n: usize,
    pub segs: usize,
    pub tokens: usize,
    pub mode: u32,
    pub pre: f32,
    pub post: f32,
    pub weight: bool,
    pub w_off: usize,
    pub x_pad: usize,
    pub out_pad: usize,
    /// Some(n): x_row_sel 1 and count_sel 1 (the final norm of the LM head rows).
    pub n_out: Option<usize>,
    /// Some(pad): chain ≥ 1, out2[t] = norm(out[t]) · w2 with out2_stride = n + pad.
    pub chain: Option<usize>,
    /// Chained outputs (1..=3) when `chain` is Some: out3, out4 with weights w3, w4 and posts.
    pub chained: usize,
    /// Threads per workgroup: 512 is the backend's decode form where the device allows it
    /// (`kernels::rmsnorm`), 256 elsewhere; 1024 with `KESTREL_RMSNORM_WG`.
    pub wg: u32,
    /// Some(gs) (the rows form only): also writing every output's sums over groups of gs
    /// values (`RmsNormRows { sums: true }`).
    pub sums: Option<usize>,
    /// With `sums`: the chained outputs' sums only, not out's (a residual norm chained into the
    /// next input norms, as chunks run it: the input norms' outputs feed the mat-mats, the
    /// residual stream does not).
    pub sums_chained_only: bool,
    /// Some(wg): the chunk norms' rows form (`RmsNormRows`, rmsnorm_rows.wgsl) on wg threads per
    /// row; its weights then start at multiples of 4 (rows of vec4).
    pub rows: Option<u32>,
    /// Above 1 (the rows form only): x read as the sum of this many split-k partials (qmm_sum's
    /// layout and order); x itself is poison.
    pub splits: usize,
}

impl NormCase {
    pub fn new(n: usize, tokens: usize, mode: u32) -> Self {
        NormCase {
            n,
            segs: 1,
            tokens,
            mode,
            pre: 1.0,
            post: 1.0,
            weight: true,
            w_off: 0,
            x_pad: 0,
            out_pad: 0,
            n_out: None,
            chain: None,
            chained: 1,
            wg: 256,
            sums: None,
            sums_chained_only: false,
            rows: None,
            splits: 0,
        }
    }
}

/// Where output j's group sums start in the norm case's xsum buffer (3 words of poison first:
/// an offset that is no multiple of anything), and its length.
pub fn norm_sums_layout(count: usize, groups: usize, outputs: usize) -> (impl Fn(usize) -> usize, usize) {
    (move |j: usize| 3 + j * count * groups, 3 + outputs * count * groups)
}

impl Case for NormCase {
    fn kernel(&self) -> Kernel {
        match self.rows {
            Some(wg) => Kernel::RmsNormRows {
                v4: (self.n as u32).div_ceil(4 * wg).max(1),
                wg,
                sums: self.sums.is_some(),
                parts: self.splits > 1,
            },
            None => {
                assert!(self.sums.is_none(), "{}: only the rows form writes group sums", self.name());
                Kernel::RmsNorm { v: rmsnorm_v(self.n, self.wg), wg: self.wg }
            }
        }
    }

    fn name(&self) -> String {
        let c = self;
        let mut s = format!("rmsnorm(n={},segs={},tokens={},mode={}", c.n, c.segs, c.tokens, c.mode);
        if c.pre != 1.0 || c.post != 1.0 {
            s += &format!(",pre={},post={}", c.pre, c.post);
        }
        if !c.weight {
            s += ",NO_WEIGHT";
        } else if c.w_off > 0 {
            s += &format!(",w_off={}", c.w_off);
        }
        if c.x_pad > 0 || c.out_pad > 0 {
            s += &format!(",x_stride={},out_stride={}", c.segs * c.n + c.x_pad, c.segs * c.n + c.out_pad);
        }
        if let Some(n) = c.n_out {
            s += &format!(",x_row_sel=1,count_sel=1,n_out={n}");
        }
        if let Some(pad) = c.chain {
            s += &format!(",chain={},out2_stride={}", c.chained, c.n + pad);
        }
        if c.wg != 256 {
            s += &format!(",wg={}", c.wg);
        }
        if let Some(gs) = c.sums {
            s += &format!(",{},gs={gs}", if c.sums_chained_only { "sums_chained" } else { "sums" });
        }
        if let Some(wg) = c.rows {
            s += &format!(",rows,wg={wg}");
        }
        if c.splits > 1 {
            s += &format!(",splits={}", c.splits);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &NormCase {
            n,
            segs,
            tokens,
            mode,
            pre,
            post,
            weight,
            w_off,
            x_pad,
            out_pad,
            n_out,
            chain,
            chained,
            sums,
            sums_chained_only,
            rows,
            splits,
            ..
        } = self;
        let count = n_out.unwrap_or(tokens);
        let out_row0 = tokens - n_out.unwrap_or(1);
        let (x_stride, out_stride) = (segs * n + x_pad, segs * n + out_pad);
        let mut x = vec![POISON; tokens * x_stride];
        for t in 0..tokens {
            x[t * x_stride..t * x_stride + segs * n].copy_from_slice(&bits(&rng.vec(segs * n)));
        }
        // Over split-k partials: the reference's x is their f32 sum in qmm_sum's order (part s
        // of token t is row s · tokens + t), the kernel's x binding all poison.
        let mut part = vec![POISON; 4];
        if splits > 1 {
            assert!(
                segs == 1 && x_pad == 0 && n_out.is_none() && rows.is_some(),
                "{}: partials need the rows form's plain rows",
                self.name()
            );
            part = bits(&rng.vec(splits * tokens * n));
            for t in 0..tokens {
                for i in 0..n {
                    let mut acc = f32::from_bits(part[t * n + i]);
                    for s in 1..splits {
                        acc += f32::from_bits(part[(s * tokens + t) * n + i]);
                    }
                    x[t * n + i] = acc.to_bits();
                }
            }
        }
        let xref = x;
        let x = if splits > 1 { vec![POISON; tokens * x_stride] } else { xref.clone() };
        // Norm weights sit at w_off inside a larger buffer (the chained norm's at w2_off, after
        // them); everything else in it is poison.
        let wv = rng.vec(n);
        // The chained norms' weights w2, w3, w4, each n + 3 after the previous.
        let wc: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n)).collect();
        let wc_off = |j: usize| {
            let off = w_off + (j + 1) * (n + 3);
            if rows.is_some() {
                off.next_multiple_of(4)
            } else {
                off
            }
        };
        let mut wt = vec![POISON; wc_off(2) + n + 4];
        if weight {
            wt[w_off..w_off + n].copy_from_slice(&bits(&wv));
        }
        for (j, w) in wc.iter().enumerate() {
            wt[wc_off(j)..wc_off(j) + n].copy_from_slice(&bits(w));
        }
        // The router norm's H^-½ on the second chained output.
        let posts = [1.0f32, 0.125, 1.0];
        let mut out = vec![POISON; count * out_stride];
        // Mode 2's residual: its own buffer (the stream ping-pongs), out starts as poison.
        let mut res = vec![POISON; count * out_stride];
        for t in 0..count {
            for s in 0..segs {
                let ob = t * out_stride + s * n;
                for i in 0..n {
                    if mode >= 1 {
                        let resid = rng.uniform().to_bits();
                        if mode == 1 {
                            out[ob + i] = resid;
                        } else {
                            res[ob + i] = resid;
                        }
                    }
                }
            }
        }
        let want_out = want.then(|| {
            let mut want = vec![None; count * out_stride];
            for t in 0..count {
                let xr = if n_out.is_some() { out_row0 + t } else { t };
                for s in 0..segs {
                    let xb = xr * x_stride + s * n;
                    let mut v: Vec<f32> = (0..n).map(|i| f32::from_bits(xref[xb + i]) * pre).collect();
                    reference::rmsnorm(&mut v, weight.then_some(&wv[..]), EPS);
                    let ob = t * out_stride + s * n;
                    for i in 0..n {
                        let mut y = v[i] as f64;
                        if mode >= 1 {
                            let resid = f32::from_bits(if mode == 1 { out[ob + i] } else { res[ob + i] });
                            y += resid as f64;
                        }
                        want[ob + i] = Some(y * post as f64);
                    }
                }
            }
            want
        });
        // The chained norms, from the expected out rows rounded to f32 (what the kernel holds).
        let out2_stride = n + chain.unwrap_or(0);
        let n_chained = if chain.is_some() { chained } else { 0 };
        let mut bufs =
            vec![input_words("x", &x), input_words("wt", &wt), output_f32("out", out, want_out.clone(), tol::NORM)];
        for (j, name) in ["out2", "out3", "out4"].into_iter().enumerate() {
            bufs.push(if j < n_chained {
                let want2 = want_out.as_ref().map(|want| {
                    let mut want2 = vec![None; count * out2_stride];
                    for t in 0..count {
                        let mut v: Vec<f32> =
                            (0..n).map(|i| want[t * out_stride + i].expect("row written") as f32).collect();
                        reference::rmsnorm(&mut v, Some(&wc[j]), EPS);
                        for i in 0..n {
                            want2[t * out2_stride + i] = Some(v[i] as f64 * posts[j] as f64);
                        }
                    }
                    want2
                });
                output_f32(name, vec![POISON; count * out2_stride], want2, tol::NORM)
            } else {
                // Unchained outputs must stay untouched.
                output_f32(name, vec![POISON; 4], want.then(|| vec![None; 4]), tol::NORM)
            });
        }
        bufs.push(input_words("res", &res));
        // The chunk form's group sums of every output it writes (or of the chained ones only),
        // from the expected rows rounded to f32 (each carries the rows' tol::NORM error, summed
        // over ≤ 128 of them: the same bound); the post check below holds each to f32
        // summation's bound over the values the kernel wrote, in whatever order the subgroups
        // add them.
        let gs = sums.unwrap_or(0);
        let outputs = 1 + n_chained;
        let summed: Vec<usize> = (0..outputs).filter(|&j| j > 0 || !sums_chained_only).collect();
        let groups = n.checked_div(gs).unwrap_or(0);
        let (sum_at, sums_len) = norm_sums_layout(count, groups, outputs);
        if gs > 0 {
            let want_s = want.then(|| {
                let mut want_s = vec![None; sums_len];
                for &j in &summed {
                    let (b, stride) = (&bufs[2 + j], if j == 0 { out_stride } else { out2_stride });
                    let Check::F32 { want, .. } = &b.check else { unreachable!("outputs are f32") };
                    for t in 0..count {
                        for g in 0..groups {
                            let row = t * stride + g * gs;
                            want_s[sum_at(j) + t * groups + g] =
                                Some((0..gs).map(|i| want[row + i].expect("row written") as f32 as f64).sum());
                        }
                    }
                }
                want_s
            });
            bufs.push(output_f32("xsum", vec![POISON; sums_len], want_s, tol::NORM));
        } else {
            // The decode form has no binding 9: whatever is bound there stays untouched.
            bufs.push(output_f32("xsum", vec![POISON; 4], want.then(|| vec![None; 4]), tol::NORM));
        }
        let mut sum_off = [0u32; 4];
        for (j, o) in sum_off.iter_mut().enumerate().take(outputs) {
            *o = sum_at(j) as u32;
        }
        let p = NormParams {
            n: n as u32,
            segs: segs as u32,
            x_stride: x_stride as u32,
            x_row_sel: n_out.is_some() as u32,
            out_stride: out_stride as u32,
            w_off: if weight { w_off as u32 } else { NO_WEIGHT },
            mode,
            count_sel: n_out.is_some() as u32,
            pre,
            post,
            eps: EPS,
            chain: n_chained as u32,
            w2_off: wc_off(0) as u32,
            w3_off: wc_off(1) as u32,
            w4_off: wc_off(2) as u32,
            post2: posts[0],
            post3: posts[1],
            post4: posts[2],
            out2_stride: out2_stride as u32,
            gs: gs as u32,
            sums: if gs > 0 { summed.iter().map(|&j| 1u32 << j).sum() } else { 0 },
            sum_off,
            splits: splits as u32,
            ..Default::default()
        };
        // Binding 10: the partials, or poison where the form reads none.
        bufs.push(input_words("part", &part));
        let step = Step {
            n_tokens: tokens as u32,
            pos0: 0,
            n_out: n_out.unwrap_or(1) as u32,
            out_row0: out_row0 as u32,
            ..Default::default()
        };
        let mut l = launch(self.kernel(), bufs, &p, step, (segs, count));
        if gs > 0 && want == Want::Reference {
            l.post = Some(Box::new(move |out: &[Vec<u8>]| {
                let xsum = f32s(&out[7]);
                for &j in &summed {
                    let (o, stride) = (f32s(&out[2 + j]), if j == 0 { out_stride } else { out2_stride });
                    for t in 0..count {
                        for g in 0..groups {
                            // |f32 sum − exact sum| ≤ (gs − 1) · 2^-24 · Σ|v| in any order.
                            let vals = &o[t * stride + g * gs..t * stride + (g + 1) * gs];
                            let exact: f64 = vals.iter().map(|&v| v as f64).sum();
                            let bound = gs as f64 * f32::EPSILON as f64 / 2.0
                                * vals.iter().map(|&v| (v as f64).abs()).sum::<f64>();
                            let got = xsum[sum_at(j) + t * groups + g] as f64;
                            if (got - exact).abs() > bound {
                                return Err(format!("xsum of output {j}, token {t}, group {g}: {got:e}, the written values sum to {exact:e} (f32 bound {bound:.1e})"));
                            }
                        }
                    }
                }
                Ok(format!("xsum within f32 summation's bound of the written rows ({} outputs)", summed.len()))
            }));
        }
        l
    }
}

pub fn norm_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    // Input norms: real hidden sizes and awkward n (1 element, partial and exact 128-lane sweeps).
    for n in [1536, 2560, 1, 7, 127, 128, 129, 255] {
        for tokens in [1, 3, 9] {
            v.push(Box::new(NormCase::new(n, tokens, 0)));
        }
    }
    // Sandwich post-norms folded into the residual add, with and without the layer scalar.
    for n in [1536, 129] {
        for tokens in [1, 9] {
            for post in [1.0, 0.37] {
                v.push(Box::new(NormCase { post, ..NormCase::new(n, tokens, 1) }));
            }
        }
    }
    // The PLE projection norm of E2B: 35 segments of 256, pre = 1536^-½, post = 2^-½, added to out.
    let ple = NormCase {
        segs: 35,
        pre: (1536f64).powf(-0.5) as f32,
        post: std::f32::consts::FRAC_1_SQRT_2,
        ..NormCase::new(256, 3, 1)
    };
    v.push(Box::new(ple));
    v.push(Box::new(NormCase { tokens: 1, ..ple }));
    // The final norm: only the LM head rows (x_row_sel 1, count_sel 1).
    for (tokens, n_out) in [(9, 1), (9, 3), (1, 1)] {
        v.push(Box::new(NormCase { n_out: Some(n_out), ..NormCase::new(1536, tokens, 0) }));
    }
    // The residual read from another buffer (mode 2: decode's ping-pong), chained or not.
    for (n, tokens, post) in [(1536, 1, 1.0), (2560, 3, 0.37), (3200, 2, 1.0)] {
        v.push(Box::new(NormCase { post, ..NormCase::new(n, tokens, 2) }));
        v.push(Box::new(NormCase { post, chain: Some(0), out_pad: 3, ..NormCase::new(n, tokens, 2) }));
    }
    // Scale-free norm, a weight at an offset, strided rows.
    for mode in [0, 1, 2] {
        v.push(Box::new(NormCase { weight: false, ..NormCase::new(256, 3, mode) }));
        v.push(Box::new(NormCase { w_off: 11, x_pad: 5, out_pad: 3, ..NormCase::new(129, 3, mode) }));
    }
    v.push(Box::new(NormCase { segs: 3, x_pad: 7, out_pad: 2, w_off: 4, ..NormCase::new(65, 9, 0) }));
    // A residual post-norm chained into the next block's input norm (E2B/E4B widths, the layer
    // scalar, a width past the register block's 12 · 256 values, strided rows).
    for (n, tokens, post) in [(1536, 1, 1.0), (2560, 9, 0.37), (3200, 3, 1.0), (129, 3, 1.0)] {
        v.push(Box::new(NormCase { post, chain: Some(0), ..NormCase::new(n, tokens, 1) }));
    }
    v.push(Box::new(NormCase { chain: Some(5), out_pad: 3, w_off: 11, ..NormCase::new(129, 3, 0) }));
    // A MoE layer's post-attention norm: pre-MLP, router (post H^-½) and pre-expert norms (26B
    // hidden 2816), and two outputs past the register block.
    v.push(Box::new(NormCase { chain: Some(0), chained: 3, ..NormCase::new(2816, 1, 1) }));
    v.push(Box::new(NormCase { chain: Some(0), chained: 3, ..NormCase::new(2816, 3, 1) }));
    v.push(Box::new(NormCase { chain: Some(2), chained: 2, ..NormCase::new(3200, 2, 1) }));
    // 512 and 1024 threads: rows shorter than the workgroup, E2B/E4B/26B widths, chained
    // outputs, the residual modes, past the register block (12 · 512 values).
    for wg in [512, 1024] {
        for (n, tokens, mode) in [(129, 3, 0), (1536, 9, 1), (2560, 3, 2), (7000, 2, 0)] {
            v.push(Box::new(NormCase { wg, ..NormCase::new(n, tokens, mode) }));
        }
        v.push(Box::new(NormCase { wg, chain: Some(0), chained: 3, ..NormCase::new(2816, 3, 1) }));
    }
    // The rest of what decode and verify steps meet, on 512 threads (their default) and 1024:
    // the PLE projection norm's 35 segments, the LM head rows, scale-free, a weight at an offset
    // with strided rows, segments with strides, a chained norm with its weights at an offset.
    for c in [
        ple,
        NormCase { n_out: Some(3), ..NormCase::new(1536, 9, 0) },
        NormCase { weight: false, ..NormCase::new(2560, 3, 2) },
        NormCase { w_off: 11, x_pad: 5, out_pad: 3, ..NormCase::new(2560, 3, 1) },
        NormCase { segs: 3, x_pad: 7, out_pad: 2, w_off: 4, ..NormCase::new(65, 9, 0) },
        NormCase { chain: Some(5), out_pad: 3, w_off: 11, ..NormCase::new(2560, 3, 0) },
    ] {
        v.push(Box::new(NormCase { wg: 512, ..c }));
        v.push(Box::new(NormCase { wg: 1024, ..c }));
    }
    // The chunk norms' rows form (rmsnorm_rows.wgsl) on 64, 128 and 256 threads per row: input
    // norms at real and awkward widths (one vec4, rows shorter than the workgroup, a partial last
    // sweep), the residual modes with the layer scalar, strided rows and a weight at an offset,
    // scale-free, a chained input norm and a MoE layer's three chained outputs, the PLE
    // projection norm (35 segments), the LM head rows, and the group sums (gs 32 / 64 / 128,
    // one group per row).
    let r = |wg, c: NormCase| Box::new(NormCase { rows: Some(wg), ..c }) as Box<dyn Case>;
    for wg in [64, 128, 256] {
        for (n, tokens) in [(1536, 9), (2560, 3), (4, 3), (132, 2), (1028, 2)] {
            v.push(r(wg, NormCase::new(n, tokens, 0)));
        }
        v.push(r(wg, NormCase { post: 0.37, ..NormCase::new(2560, 3, 1) }));
        v.push(r(wg, NormCase { post: 0.37, chain: Some(4), out_pad: 8, ..NormCase::new(2560, 5, 2) }));
        v.push(r(wg, NormCase { chain: Some(0), chained: 3, post: 0.37, ..NormCase::new(2816, 3, 1) }));
        v.push(r(wg, NormCase { w_off: 8, x_pad: 4, out_pad: 12, ..NormCase::new(1536, 3, 2) }));
        v.push(r(wg, NormCase { weight: false, ..NormCase::new(256, 3, 1) }));
        v.push(r(wg, NormCase { n_out: Some(3), ..NormCase::new(2560, 9, 0) }));
        v.push(r(wg, s_case(64, NormCase::new(1536, 9, 0))));
        v.push(r(wg, s_case(64, NormCase { chain: Some(4), out_pad: 8, ..NormCase::new(2560, 5, 2) })));
        v.push(r(wg, s_case(64, NormCase { chain: Some(0), chained: 3, post: 0.37, ..NormCase::new(2816, 3, 1) })));
    }
    v.push(r(64, ple));
    v.push(r(128, NormCase { tokens: 1, ..ple }));
    v.push(r(128, s_case(128, NormCase { chain: Some(0), ..NormCase::new(2560, 2, 1) })));
    v.push(r(64, s_case(32, NormCase { chain: Some(0), chained: 2, ..NormCase::new(96, 4, 2) })));
    v.push(r(128, s_case(64, NormCase::new(64, 3, 0))));
    // A residual norm (mode 2) chained into the next input norm with the sums of its chained
    // output only, as chunks run it (the benchmark's residual-norm rows).
    v.push(r(
        256,
        NormCase { sums_chained_only: true, ..s_case(64, NormCase { chain: Some(0), ..NormCase::new(2560, 5, 2) }) },
    ));
    // The rows form over split-k partials (KESTREL_NORM_SPLITS): the residual norms' shapes
    // (E4B's chained into the next input norm with its group sums, E2B's, the 26B's three
    // chained outputs) and a row shorter than the workgroup.
    let sp = |wg, splits, c: NormCase| Box::new(NormCase { rows: Some(wg), splits, ..c }) as Box<dyn Case>;
    v.push(sp(256, 8, s_case(64, NormCase { chain: Some(0), post: 0.37, ..NormCase::new(2560, 5, 2) })));
    v.push(sp(128, 2, NormCase::new(1536, 3, 2)));
    v.push(sp(64, 3, s_case(64, NormCase { chain: Some(0), chained: 3, ..NormCase::new(2816, 3, 2) })));
    v.push(sp(256, 4, NormCase::new(132, 2, 2)));
    v
}

/// `c` with group sums over groups of `gs`.
pub fn s_case(gs: usize, c: NormCase) -> NormCase {
    NormCase { sums: Some(gs), ..c }
}

/// The rows form over split-k partials writes bitwise what qmm_sum (the partials added into x)
/// and then the rows form over x write: the partials are added in qmm_sum's order.
#[test]
fn rmsnorm_rows_over_partials_is_bitwise_qmm_sum_then_the_norm() {
    crate::each_runner(|h| {
        let cases = [
            NormCase {
                rows: Some(256),
                splits: 8,
                sums: Some(64),
                chain: Some(0),
                post: 0.37,
                ..NormCase::new(2560, 5, 2)
            },
            NormCase { rows: Some(64), splits: 3, ..NormCase::new(132, 2, 2) },
        ];
        for c in cases {
            let l = c.build(&mut Rng::new(seed_of(&c.name())), Want::Reference);
            let init: Vec<Vec<u8>> = l.buffers();
            let parts = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
            // qmm_sum of the same partials into x, then the rows form over that x.
            let mp = MatmulParams {
                rows: c.n as u32,
                y_stride: c.n as u32,
                k_splits: c.splits as u32,
                ..Default::default()
            };
            let x = h
                .run(
                    Kernel::QmmSum,
                    &[init[8].clone(), init[0].clone()],
                    bytemuck::bytes_of(&mp),
                    l.step,
                    ((c.n as u32).div_ceil(256), c.tokens as u32, 1),
                )
                .unwrap();
            let mut p: NormParams = l.params_as();
            p.splits = 0;
            let mut over_x = init.clone();
            over_x[0] = x[1].clone();
            let plain =
                h.run(NormCase { splits: 0, ..c }.kernel(), &over_x, bytemuck::bytes_of(&p), l.step, l.grid).unwrap();
            let outputs = if c.chain.is_some() { 1 + c.chained } else { 1 };
            let b = h.backend();
            for j in 0..outputs {
                assert!(
                    parts[2 + j] == plain[2 + j],
                    "{} [{b}]: output {j} differs from qmm_sum then the norm",
                    c.name()
                );
            }
            assert!(parts[7] == plain[7], "{} [{b}]: the group sums differ", c.name());
        }
    });
}

/// The rows form's sums form writes bitwise the outputs of its plain form (checked against the
/// CPU in `norm_cases`): the sums are added beside the rows, not into them; and the plain form
/// leaves xsum alone.
#[test]
fn rmsnorm_rows_sums_form_writes_the_plain_forms_outputs() {
    crate::each_runner(|h| {
        let cases = [
            NormCase { rows: Some(256), sums: Some(64), ..NormCase::new(1536, 9, 0) },
            NormCase { rows: Some(256), sums: Some(64), chain: Some(4), out_pad: 8, ..NormCase::new(2560, 5, 2) },
            NormCase {
                rows: Some(64),
                sums: Some(64),
                chain: Some(0),
                chained: 3,
                post: 0.37,
                ..NormCase::new(2816, 3, 1)
            },
        ];
        for c in cases {
            let l = c.build(&mut Rng::new(seed_of(&c.name())), Want::Reference);
            let init: Vec<Vec<u8>> = l.buffers();
            let with_sums = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
            let plain = h.run(NormCase { sums: None, ..c }.kernel(), &init, &l.params, l.step, l.grid).unwrap();
            let outputs = if c.chain.is_some() { 1 + c.chained } else { 1 };
            let b = h.backend();
            for j in 0..outputs {
                assert!(
                    with_sums[2 + j] == plain[2 + j],
                    "{} [{b}]: output {j} differs between the two forms",
                    c.name()
                );
            }
            assert!(plain[7] == init[7], "{} [{b}]: the plain form wrote xsum", c.name());
            assert!(with_sums[7] != init[7], "{} [{b}]: the sums form left xsum alone", c.name());
            println!("{} [{b}]: {outputs} outputs bitwise equal to the plain form OK", c.name());
        }
    });
}

// ---------------------------------------------------------------------------------------------
// head_norm_rope

#[derive(Clone, Copy)]
pub enum RopeKind {
    Off,
    /// All d/2 pairs rotate (sliding layers).
    Default {
        theta: f64,
    },
    /// Only int(partial · d/2) pairs rotate, the exponent still over d (full layers of Gemma 4).
    Proportional {
        theta: f64,
        partial: f64,
    },
}

/// Per token t and head h: norm(src) · w, rope at pos0 + t, to dst (q layout, or the cache slot of
/// the position when `slots` is Some: dst_mode 1). Defaults: src_stride = heads·d.
#[derive(Clone, Copy)]
pub struct HeadCase {
    pub d: usize,
    pub heads: usize,
    pub tokens: usize,
    pub pos0: usize,
    pub rope: RopeKind,
    pub weight: bool,
    pub slots: Option<usize>,
    pub src_pad: usize,
    /// Where the heads start in each src row (a later projection of stacked q | k | v).
    pub src_off: usize,
    /// Threads per head (`HeadNormRope { wg }`; d ≤ 4 · wg).
    pub wg: u32,
}

/// Offset of the norm weight in its buffer (the words before it are poison).
pub const HEAD_W_OFF: usize = 5;

impl HeadCase {
    pub fn new(d: usize, heads: usize, tokens: usize, pos0: usize, rope: RopeKind) -> Self {
        HeadCase { d, heads, tokens, pos0, rope, weight: true, slots: None, src_pad: 0, src_off: 0, wg: HEAD_NORM_WG }
    }
    /// Where this rope's cos/sin sit in a token's table row and the row length: as in the real
    /// program, sliding-layer ropes first and full-layer ropes after them (here the other layer
    /// kind's section is a stand-in of poison, so reading the wrong one fails).
    pub fn rope_layout(&self) -> (usize, usize) {
        match self.rope {
            RopeKind::Off => (0, self.d),
            RopeKind::Default { .. } => (0, 3 * self.d),
            RopeKind::Proportional { .. } => (self.d / 2, self.d / 2 + self.d),
        }
    }
}

impl Case for HeadCase {
    fn kernel(&self) -> Kernel {
        Kernel::HeadNormRope { wg: self.wg }
    }

    fn name(&self) -> String {
        let c = self;
        let rope = match c.rope {
            RopeKind::Off => "off".to_string(),
            RopeKind::Default { theta } => format!("default(theta={theta})"),
            RopeKind::Proportional { theta, partial } => format!("proportional(theta={theta},partial={partial})"),
        };
        let (off, stride) = c.rope_layout();
        let mut s =
            format!("head_norm_rope(d={},heads={},tokens={},pos0={},rope={rope}", c.d, c.heads, c.tokens, c.pos0);
        if !matches!(c.rope, RopeKind::Off) {
            s += &format!(",rope_off={off},rope_stride={stride}");
        }
        s += if c.weight { ",w_off=5" } else { ",NO_WEIGHT" };
        if c.src_pad > 0 || c.src_off > 0 {
            s += &format!(",src_stride={},src_off={}", c.src_off + c.heads * c.d + c.src_pad, c.src_off);
        }
        s += &match c.slots {
            None => ",dst_mode=0".to_string(),
            Some(n) => format!(",dst_mode=1,slots={n}"),
        };
        if c.wg != HEAD_NORM_WG {
            s += &format!(",wg={}", c.wg);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &HeadCase { d, heads, tokens, pos0, rope, weight, slots, src_pad, src_off, .. } = self;
        let (half, row) = (d / 2, heads * d);
        let src_stride = src_off + row + src_pad;
        let mut src = vec![POISON; tokens * src_stride];
        for t in 0..tokens {
            src[t * src_stride + src_off..t * src_stride + src_off + row].copy_from_slice(&bits(&rng.vec(row)));
        }
        let wv = rng.vec(d);
        let mut wt = vec![POISON; HEAD_W_OFF + d + 3];
        if weight {
            wt[HEAD_W_OFF..HEAD_W_OFF + d].copy_from_slice(&bits(&wv));
        }
        // The per-step rope table, built as the backend's write_rope does.
        let inv_freq = match rope {
            RopeKind::Off => None,
            RopeKind::Default { theta } => Some(Rope { theta, rotated_pairs: half, head_dim: d }.inv_freq()),
            RopeKind::Proportional { theta, partial } => {
                Some(Rope { theta, rotated_pairs: (partial * d as f64 / 2.0) as usize, head_dim: d }.inv_freq())
            }
        };
        let (rope_off, rope_stride) = self.rope_layout();
        let mut table = vec![POISON; tokens * rope_stride];
        let (mut cos, mut sin) = (vec![vec![0.0f32; half]; tokens], vec![vec![0.0f32; half]; tokens]);
        if let Some(f) = &inv_freq {
            for t in 0..tokens {
                reference::rope_table(f, pos0 + t, &mut cos[t], &mut sin[t]);
                let b = t * rope_stride + rope_off;
                table[b..b + half].copy_from_slice(&bits(&cos[t]));
                table[b + half..b + d].copy_from_slice(&bits(&sin[t]));
            }
        }
        let dst_rows = slots.unwrap_or(tokens);
        assert!(tokens <= dst_rows, "two tokens of one step would share a cache slot");
        let want_dst = want.then(|| {
            let mut want = vec![None; dst_rows * row];
            for t in 0..tokens {
                let dst_row = slots.map_or(t, |s| (pos0 + t) % s);
                for h in 0..heads {
                    let sb = t * src_stride + src_off + h * d;
                    let mut v: Vec<f32> = src[sb..sb + d].iter().map(|&b| f32::from_bits(b)).collect();
                    reference::rmsnorm(&mut v, weight.then_some(&wv[..]), EPS);
                    if inv_freq.is_some() {
                        reference::rope(&mut v, &cos[t], &sin[t]);
                    }
                    for i in 0..d {
                        want[dst_row * row + h * d + i] = Some(v[i] as f64);
                    }
                }
            }
            want
        });
        let bufs = vec![
            input_words("src", &src),
            input_words("wt", &wt),
            input_words("rope", &table),
            output_f32("dst", vec![POISON; dst_rows * row], want_dst, tol::NORM),
        ];
        let p = HeadParams {
            d: d as u32,
            n_heads: heads as u32,
            src_stride: src_stride as u32,
            w_off: if weight { HEAD_W_OFF as u32 } else { NO_WEIGHT },
            rope: inv_freq.is_some() as u32,
            rope_off: rope_off as u32,
            rope_stride: rope_stride as u32,
            dst_mode: slots.is_some() as u32,
            slots: slots.unwrap_or(0) as u32,
            eps: EPS,
            src_off: src_off as u32,
            _pad: 0,
        };
        let step = Step {
            n_tokens: tokens as u32,
            pos0: pos0 as u32,
            n_out: 1,
            out_row0: tokens as u32 - 1,
            ..Default::default()
        };
        launch(self.kernel(), bufs, &p, step, (heads, tokens))
    }
}

pub fn head_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    let sliding = RopeKind::Default { theta: 10_000.0 };
    let full = RopeKind::Proportional { theta: 1_000_000.0, partial: 0.25 };
    // q heads: every head_dim with both ropes (E2B: sliding d 256, full d 512, 8 heads).
    for d in [32, 64, 256, 512] {
        for rope in [sliding, full] {
            for (tokens, pos0) in [(3, 5), (9, 1000)] {
                v.push(Box::new(HeadCase::new(d, 8, tokens, pos0, rope)));
            }
        }
    }
    // Token counts, large positions (angles from the host table), a strided source.
    for tokens in [1, 17] {
        v.push(Box::new(HeadCase::new(64, 3, tokens, 0, sliding)));
    }
    v.push(Box::new(HeadCase::new(256, 2, 3, 131_000, full)));
    v.push(Box::new(HeadCase { src_pad: 24, ..HeadCase::new(64, 4, 3, 7, sliding) }));
    // K and V read out of a stacked q | k | v row (E2B sliding: q 8 × 256, k and v 1 × 256).
    for (src_off, src_pad) in [(2048, 256), (2304, 0)] {
        v.push(Box::new(HeadCase { src_off, src_pad, slots: Some(9), ..HeadCase::new(256, 1, 3, 7, sliding) }));
    }
    v.push(Box::new(HeadCase::new(128, 2, 3, 7, RopeKind::Off)));
    // K (norm + rope) and V (scale-free norm, no rope) into ring caches: slots wrap inside the step.
    for (d, heads, rope) in [(256, 1, sliding), (512, 2, full), (32, 2, sliding)] {
        for (tokens, pos0, slots) in [(5, 6, 8), (1, 37, 8), (9, 1000, 9)] {
            v.push(Box::new(HeadCase { slots: Some(slots), ..HeadCase::new(d, heads, tokens, pos0, rope) }));
            v.push(Box::new(HeadCase {
                slots: Some(slots),
                weight: false,
                ..HeadCase::new(d, heads, tokens, pos0, RopeKind::Off)
            }));
        }
    }
    // 64 and 128 threads per head (KESTREL_HEAD_NORM_WG): four values per thread at d = 4 · wg
    // (E2B/E4B's sliding 256, full 512), fewer below, both ropes, a cache write, a source offset.
    for (d, wg) in [(256, 64), (512, 128), (256, 128), (32, 64)] {
        for rope in [sliding, full] {
            v.push(Box::new(HeadCase { wg, ..HeadCase::new(d, 8, 9, 1000, rope) }));
        }
        v.push(Box::new(HeadCase {
            wg,
            slots: Some(9),
            src_off: 2 * d,
            src_pad: 8,
            ..HeadCase::new(d, 1, 3, 7, sliding)
        }));
        v.push(Box::new(HeadCase { wg, slots: Some(8), weight: false, ..HeadCase::new(d, 2, 5, 6, RopeKind::Off) }));
    }
    v
}

/// qkv_norm_rope (one dispatch for the q, k and v heads of a stacked q | k | v row) writes
/// bitwise what three head_norm_rope dispatches write (those are checked against the CPU
/// reference in `head_cases`): E2B's sliding (8 q heads, 1 kv head, d 256) and full (d 512)
/// layers, a GQA layer with K-as-V (v_off = k_off), several tokens wrapping the ring.
#[test]
fn qkv_norm_rope_is_bitwise_three_head_norm_ropes() {
    crate::each_runner(|h| {
        // (d, n_q, n_kv, k_eq_v, tokens, pos0, slots)
        for (d, n_q, n_kv, k_eq_v, tokens, pos0, slots) in
            [(256, 8, 1, false, 1, 130, 640), (512, 8, 1, false, 1, 600, 602), (64, 6, 2, true, 3, 7, 8)]
        {
            let mut rng = Rng::new(d as u64 * 31 + n_kv as u64);
            let (q_dim, kv_dim) = (n_q * d, n_kv * d);
            let stride = q_dim + kv_dim * if k_eq_v { 1 } else { 2 };
            let (k_off, v_off) = (q_dim, if k_eq_v { q_dim } else { q_dim + kv_dim });
            let src = to_bytes(&bits(&rng.vec(tokens * stride)));
            let (q_w, k_w) = (3usize, 3 + d + 5);
            let wt = to_bytes(&bits(&rng.vec(k_w + d + 2)));
            // A rope table of real angles, rows `rope_stride` apart, this layer's section at d / 2.
            let (rope_off, rope_stride) = (d / 2, d / 2 + d);
            let inv_freq = Rope { theta: 10_000.0, rotated_pairs: d / 2, head_dim: d }.inv_freq();
            let mut table = vec![0f32; tokens * rope_stride];
            for t in 0..tokens {
                let row = &mut table[t * rope_stride + rope_off..t * rope_stride + rope_off + d];
                let (c, s) = row.split_at_mut(d / 2);
                reference::rope_table(&inv_freq, pos0 + t, c, s);
            }
            let table = to_bytes(&bits(&table));
            let step = Step {
                n_tokens: tokens as u32,
                pos0: pos0 as u32,
                n_out: 1,
                out_row0: tokens as u32 - 1,
                ..Default::default()
            };
            let zeros = |n: usize| vec![0u8; 4 * n];
            let p = QkvParams {
                d: d as u32,
                src_stride: stride as u32,
                rope_off: rope_off as u32,
                rope_stride: rope_stride as u32,
                n_q: n_q as u32,
                n_kv: n_kv as u32,
                k_off: k_off as u32,
                v_off: v_off as u32,
                q_w: q_w as u32,
                k_w: k_w as u32,
                slots: slots as u32,
                eps: EPS,
            };
            let bufs = [
                src.clone(),
                wt.clone(),
                table.clone(),
                zeros(tokens * q_dim),
                zeros(slots * kv_dim),
                zeros(slots * kv_dim),
            ];
            // At the widest threads per head and at the fewest that hold the head (four values each).
            let wg_min = (d as u32).div_ceil(4).next_power_of_two().max(64);
            for wg in [HEAD_NORM_WG, wg_min] {
                let fused = h
                    .run(
                        Kernel::QkvNormRope { wg },
                        &bufs,
                        bytemuck::bytes_of(&p),
                        step,
                        ((n_q + 2 * n_kv) as u32, tokens as u32, 1),
                    )
                    .unwrap();
                // The three dispatches the backend records for separate projections, reading the stack.
                let head = |n_heads: usize,
                            src_off: usize,
                            w_off: u32,
                            rope: u32,
                            dst_mode: u32,
                            dst_len: usize,
                            h: &mut dyn KernelRunner| {
                    let hp = HeadParams {
                        d: d as u32,
                        n_heads: n_heads as u32,
                        src_stride: stride as u32,
                        w_off,
                        rope,
                        rope_off: rope_off as u32,
                        rope_stride: rope_stride as u32,
                        dst_mode,
                        slots: slots as u32,
                        eps: EPS,
                        src_off: src_off as u32,
                        _pad: 0,
                    };
                    let bufs = [src.clone(), wt.clone(), table.clone(), zeros(dst_len)];
                    h.run(
                        Kernel::HeadNormRope { wg },
                        &bufs,
                        bytemuck::bytes_of(&hp),
                        step,
                        (n_heads as u32, tokens as u32, 1),
                    )
                    .unwrap()
                    .swap_remove(3)
                };
                let want_q = head(n_q, 0, q_w as u32, 1, 0, tokens * q_dim, h);
                let want_k = head(n_kv, k_off, k_w as u32, 1, 1, slots * kv_dim, h);
                let want_v = head(n_kv, v_off, NO_WEIGHT, 0, 1, slots * kv_dim, h);
                let case = format!("qkv_norm_rope(d={d},n_q={n_q},n_kv={n_kv},k_eq_v={k_eq_v},tokens={tokens},pos0={pos0},slots={slots},wg={wg})");
                assert!(fused[3] == want_q, "{case}: q differs from head_norm_rope");
                assert!(fused[4] == want_k, "{case}: k differs from head_norm_rope");
                assert!(fused[5] == want_v, "{case}: v differs from head_norm_rope");
                assert!(want_k.iter().any(|&b| b != 0) && want_v.iter().any(|&b| b != 0), "{case}: nothing written");
                println!("{case} [{}]: q, k, v bitwise equal to head_norm_rope OK", h.backend());
            }
        }
    });
}
