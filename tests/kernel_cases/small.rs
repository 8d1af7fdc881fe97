//! The small kernels of a step: `embed` (every format, a part of a split table), `gelu_mul`
//! (the MLP's and the PLE gate's GeGLU, its chunk form with group sums, over split-k partials),
//! `softcap_argmax` + `argmax_merge` (greedy sampling over the vocabulary) and `router_topk` (the
//! MoE router's softmax and top k).

use super::*;
use kestrel::kernels::*;
use kestrel::reference::{self, embed_scale};

// ---------------------------------------------------------------------------------------------
// embed

/// `out[t] = scale · E[ids[t]]` for ids in the part [row0, row0 + rows) of a `table`-row matrix.
pub struct EmbedCase {
    pub fmt: Format,
    pub table: usize,
    pub row0: usize,
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub gs: usize,
    pub scale: f32,
}

impl Case for EmbedCase {
    fn kernel(&self) -> Kernel {
        Kernel::Embed(self.fmt)
    }

    fn name(&self) -> String {
        let c = self;
        let gs = if is_quant(c.fmt) { format!(",gs={}", c.gs) } else { String::new() };
        format!(
            "embed_{}(table={},part={}..{},cols={},tokens={}{gs},scale={})",
            c.fmt.name(),
            c.table,
            c.row0,
            c.row0 + c.rows,
            c.cols,
            c.tokens,
            c.scale
        )
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &EmbedCase { fmt, table, row0, rows, cols, tokens, gs, scale } = self;
        let w = Weights::new(fmt, table, cols, gs, rng, want);
        // The part's edges first (inside, then just outside), then random ids of the whole table.
        let end = row0 + rows;
        let mut ids: Vec<u32> = [Some(row0), Some(end - 1), row0.checked_sub(1), (end < table).then_some(end)]
            .into_iter()
            .flatten()
            .map(|i| i as u32)
            .collect();
        while ids.len() < tokens {
            ids.push(rng.below(table) as u32);
        }
        ids.truncate(tokens);
        let want_out = want.then(|| {
            let mut want = vec![None; tokens * cols];
            let mut row = vec![0.0f32; cols];
            for (t, &id) in ids.iter().enumerate() {
                let id = id as usize;
                if (row0..end).contains(&id) {
                    w.matrix().row_f32(id, &mut row);
                    for c in 0..cols {
                        want[t * cols + c] = Some((row[c] * scale) as f64);
                    }
                }
            }
            want
        });
        let tol = if is_quant(fmt) { tol::DEQUANT } else { Tol::Exact };
        let [wb, sb, bb] = w.part(row0, rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("ids", &ids),
            output_f32("out", vec![POISON; tokens * cols], want_out, tol),
        ];
        let p =
            EmbedParams { rows: rows as u32, cols: cols as u32, gs: gs as u32, row0: row0 as u32, scale, _pad: [0; 3] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(self.kernel(), bufs, &p, step, ((cols / 8).div_ceil(64), tokens))
    }
}

pub fn embed_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    for fmt in [Format::Q4, Format::Q8, Format::Bf16, Format::F32] {
        let gs = if is_quant(fmt) { 64 } else { 0 };
        let narrow = if is_quant(fmt) { 256 } else { 24 };
        let e = |table, row0, rows, cols, tokens, scale| EmbedCase { fmt, table, row0, rows, cols, tokens, gs, scale };
        // A middle part of the table: ids below, inside and above it.
        for tokens in [1, 3, 9, 17] {
            v.push(Box::new(e(70, 16, 40, narrow, tokens, embed_scale(narrow))));
        }
        // Real widths: the whole table as one part (E2B 1536, E4B 2560), the first part of a split one.
        v.push(Box::new(e(40, 0, 40, 1536, 3, embed_scale(1536))));
        v.push(Box::new(e(40, 0, 25, 2560, 9, embed_scale(2560))));
        // The PLE table of E2B: 35 layers × 256, scale √256.
        v.push(Box::new(e(12, 4, 8, 35 * 256, 3, 16.0)));
        if is_quant(fmt) {
            v.push(Box::new(EmbedCase { gs: 128, ..e(20, 5, 10, 512, 9, embed_scale(512)) }));
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// gelu_mul

/// `a[t, i] = gelu_tanh(a[t, i]) · b[t, b_off + i]`; defaults a_stride = b_stride = n, b_off 0.
#[derive(Clone, Copy)]
pub struct GeluCase {
    pub n: usize,
    pub tokens: usize,
    pub a_pad: usize,
    pub b_stride: usize,
    pub b_off: usize,
    /// a is uniform in [-range, range) (1 by the rule; 8 to reach tanh saturation).
    pub range: f32,
    /// b_in_a 1: the up values sit in a's own rows at b_off (stacked gate/up); b is unused.
    pub in_a: bool,
    /// The chunk form (`GeluMulSums`): also each token's sums of the output over groups of 64.
    pub sums: bool,
    /// Above 1 (chunk form, plain rows of b): a is read as that many split-k partials' sum.
    pub splits: usize,
}

impl GeluCase {
    pub fn new(n: usize, tokens: usize) -> Self {
        GeluCase { n, tokens, a_pad: 0, b_stride: n, b_off: 0, range: 1.0, in_a: false, sums: false, splits: 0 }
    }
}

impl Case for GeluCase {
    fn kernel(&self) -> Kernel {
        if self.sums {
            Kernel::GeluMulSums
        } else {
            Kernel::GeluMul
        }
    }

    fn name(&self) -> String {
        let c = self;
        let mut s = format!("gelu_mul(n={},tokens={}", c.n, c.tokens);
        if c.a_pad > 0 {
            s += &format!(",a_stride={}", c.n + c.a_pad);
        }
        if c.b_stride != c.n || c.b_off > 0 {
            s += &format!(",b_stride={},b_off={}", c.b_stride, c.b_off);
        }
        if c.range != 1.0 {
            s += &format!(",range={}", c.range);
        }
        if c.in_a {
            s += ",b_in_a";
        }
        if c.sums {
            s += ",sums";
        }
        if c.splits > 1 {
            s += &format!(",splits={}", c.splits);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &GeluCase { n, tokens, a_pad, b_stride, b_off, range, in_a, sums, splits } = self;
        let a_stride = n + a_pad;
        let mut a = vec![POISON; tokens * a_stride];
        let mut b = vec![POISON; tokens * b_stride];
        // Each output's gate and up values.
        let mut xy = Vec::with_capacity(tokens * n);
        // Split-k partials: the gate value is their f32 sum in qmm_sum's order; a starts as
        // poison, which must not be read.
        assert!(splits <= 1 || (sums && !in_a && a_pad == 0), "split partials: the chunk form over plain rows");
        let part: Vec<f32> =
            if splits > 1 { rng.vec(splits * tokens * n).into_iter().map(|v| v * range).collect() } else { vec![0.0] };
        for t in 0..tokens {
            for i in 0..n {
                let (mut x, y) = (rng.uniform() * range, rng.uniform());
                if splits > 1 {
                    x = part[t * n + i];
                    for s in 1..splits {
                        x += part[(s * tokens + t) * n + i];
                    }
                }
                if splits <= 1 {
                    a[t * a_stride + i] = x.to_bits();
                }
                if in_a {
                    a[t * a_stride + b_off + i] = y.to_bits();
                } else {
                    b[t * b_stride + b_off + i] = y.to_bits();
                }
                xy.push((x, y));
            }
        }
        // The sums of ≤ 64 outputs, each within tol::GELU: the same bound.
        let groups = n.div_ceil(64);
        let (want_a, want_s) = want
            .then(|| {
                let mut want = vec![None; tokens * a_stride];
                for t in 0..tokens {
                    for i in 0..n {
                        let (x, y) = xy[t * n + i];
                        if in_a {
                            // The up half is read, never written: it must keep its value.
                            want[t * a_stride + b_off + i] = Some(y as f64);
                        }
                        want[t * a_stride + i] = Some(reference::gelu_tanh(x) as f64 * y as f64);
                    }
                }
                let want_s: Vec<Option<f64>> = (0..tokens * groups)
                    .map(|i| {
                        Some(
                            (i % groups * 64..n.min(i % groups * 64 + 64))
                                .map(|j| want[i / groups * a_stride + j].expect("written"))
                                .sum(),
                        )
                    })
                    .collect();
                (want, want_s)
            })
            .unzip();
        let mut bufs = vec![output_f32("a", a, want_a, tol::GELU), input_words("b", &b)];
        if sums {
            bufs.push(output_f32("asum", vec![POISON; tokens * groups], want_s, tol::GELU));
            bufs.push(input_words("part", &bits(&part)));
        }
        let p = GeluParams {
            n: n as u32,
            a_stride: a_stride as u32,
            b_stride: b_stride as u32,
            b_off: b_off as u32,
            b_in_a: in_a as u32,
            splits: splits as u32,
            ..Default::default()
        };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(self.kernel(), bufs, &p, step, (n.div_ceil(64), tokens))
    }
}

pub fn gelu_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    // MLP widths: E2B 6144 (and its double-wide 12288 layers), E4B 10240.
    for (n, tokens) in [(6144, 3), (12288, 1), (10240, 2)] {
        v.push(Box::new(GeluCase::new(n, tokens)));
    }
    for n in [1, 63, 64, 65, 257] {
        for tokens in [1, 9, 17] {
            v.push(Box::new(GeluCase::new(n, tokens)));
        }
    }
    // The PLE gate: b is the layer's slice of the per-layer inputs (E2B: 35 layers × 256).
    for layer in [0, 17, 34] {
        v.push(Box::new(GeluCase { b_stride: 35 * 256, b_off: layer * 256, ..GeluCase::new(256, 3) }));
    }
    v.push(Box::new(GeluCase { a_pad: 5, b_stride: 80, b_off: 9, ..GeluCase::new(65, 3) }));
    // The chunk form with its sums: the PLE gate (E4B: 42 layers × 256), a partial last group,
    // a wide row.
    v.push(Box::new(GeluCase { b_stride: 42 * 256, b_off: 41 * 256, sums: true, ..GeluCase::new(256, 9) }));
    v.push(Box::new(GeluCase { a_pad: 5, sums: true, ..GeluCase::new(65, 3) }));
    v.push(Box::new(GeluCase { sums: true, ..GeluCase::new(10240, 2) }));
    // The chunk form over a split-k gate's partials (the PLE gate: 256 rows, 8 splits on E4B).
    v.push(Box::new(GeluCase { b_stride: 42 * 256, b_off: 5 * 256, sums: true, splits: 8, ..GeluCase::new(256, 9) }));
    v.push(Box::new(GeluCase { sums: true, splits: 3, ..GeluCase::new(65, 4) }));
    v.push(Box::new(GeluCase { range: 8.0, ..GeluCase::new(1000, 2) }));
    // Stacked gate/up chunks: a row is [gate (n) | up (n)], output over the gate half.
    for (n, tokens) in [(6144, 2), (65, 3)] {
        v.push(Box::new(GeluCase { a_pad: n, b_off: n, in_a: true, ..GeluCase::new(n, tokens) }));
    }
    v
}

/// gelu_mul's chunk form over a split-k gate's partials (`splits` > 1) writes bitwise what
/// qmm_sum followed by the same form over the summed gate writes (each checked against the CPU
/// in `gelu_cases`): the PLE gate's 256 rows in 8 splits, and 3 splits of a partial group.
#[test]
fn gelu_mul_over_split_partials_is_bitwise_qmm_sum_then_gelu_mul() {
    crate::each_runner(|h| {
        for c in [
            GeluCase { b_stride: 42 * 256, b_off: 5 * 256, sums: true, splits: 8, ..GeluCase::new(256, 9) },
            GeluCase { sums: true, splits: 3, ..GeluCase::new(65, 4) },
        ] {
            let l = c.build(&mut Rng::new(seed_of(&c.name())), Want::Reference);
            let mut init: Vec<Vec<u8>> = l.buffers();
            let fused = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
            // qmm_sum writes the gate (storage buffer 0, a) from the partials (3), then gelu_mul.
            let mp = MatmulParams {
                rows: c.n as u32,
                y_stride: c.n as u32,
                k_splits: c.splits as u32,
                ..Default::default()
            };
            let summed = h
                .run(
                    Kernel::QmmSum,
                    &[init[3].clone(), init[0].clone()],
                    bytemuck::bytes_of(&mp),
                    l.step,
                    (c.n.div_ceil(256) as u32, c.tokens as u32, 1),
                )
                .unwrap();
            init[0] = summed[1].clone();
            let mut p: GeluParams = l.params_as();
            p.splits = 0;
            let apart = h.run(Kernel::GeluMulSums, &init, bytemuck::bytes_of(&p), l.step, l.grid).unwrap();
            assert!(fused[0] == apart[0], "{}: a differs from qmm_sum then gelu_mul", c.name());
            assert!(fused[2] == apart[2], "{}: asum differs from qmm_sum then gelu_mul", c.name());
            println!("{} [{}]: a and asum bitwise qmm_sum then gelu_mul OK", c.name(), h.backend());
        }
    });
}

// ---------------------------------------------------------------------------------------------
// softcap_argmax

/// Per row: logits capped in place (cap > 0), best = the lowest index of the maximum. Every row
/// gets a planted maximum of 1.5 (above the [-1, 1) inputs, so the reference index is
/// unambiguous) at one index, or at several (`ties`: the lowest must win).
#[derive(Clone, Copy)]
pub struct ArgmaxCase {
    pub vocab: usize,
    pub rows: usize,
    pub cap: f32,
    pub ties: bool,
    /// About 1/8 of the logits are −∞ (masked).
    pub masked: bool,
}

impl Case for ArgmaxCase {
    /// The first of its two passes (argmax_merge the second).
    fn kernel(&self) -> Kernel {
        Kernel::SoftcapArgmax
    }

    fn name(&self) -> String {
        let c = self;
        let mut s = format!("softcap_argmax(vocab={},n_out={},cap={}", c.vocab, c.rows, c.cap);
        if c.ties {
            s += ",ties";
        }
        if c.masked {
            s += ",masked";
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &ArgmaxCase { vocab, rows, cap, ties, masked } = self;
        let mut logits = rng.vec(rows * vocab);
        if masked {
            for v in logits.iter_mut() {
                if rng.below(8) == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let mut best = Vec::with_capacity(rows);
        for r in 0..rows {
            let mut idx: Vec<usize> = Vec::new();
            if r == 0 && ties && vocab > 256 {
                // Index 255 (lane 255) ties with 256 (lane 0): the tree must still pick 255.
                idx.extend([256, 255]);
            }
            let chunk = ARGMAX_CHUNK as usize;
            if r == 1 && ties && vocab > chunk {
                // The last index of the first chunk ties with the first of the second: the merge
                // must pick the first chunk's.
                idx.extend([chunk, chunk - 1]);
            }
            let k = if ties { 4.min(vocab) } else { 1 };
            while idx.len() < k {
                let i = rng.below(vocab);
                if !idx.contains(&i) {
                    idx.push(i);
                }
            }
            for &i in &idx {
                logits[r * vocab + i] = 1.5;
            }
            best.push(Some(*idx.iter().min().unwrap() as u32));
        }
        // cap 0: the logits must come back as they were.
        let tol = if cap > 0.0 { tol::SOFTCAP } else { Tol::Exact };
        let want_logits = want.then(|| {
            let mut capped = logits.clone();
            if cap > 0.0 {
                for row in capped.chunks_mut(vocab) {
                    reference::softcap(row, cap);
                }
            }
            capped.iter().map(|&x| Some(x as f64)).collect()
        });
        let chunks = argmax_chunks(vocab);
        let part_words = 2 * rows * chunks as usize;
        let mut part = vec![POISON; part_words];
        part.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
        let part = Buf { name: "part", bytes: to_bytes(&part), check: Check::Scratch { words: part_words } };
        let bufs = vec![
            output_f32("logits", bits(&logits), want_logits, tol),
            part,
            output_u32("best", vec![POISON; rows], want.then(|| best)),
        ];
        let p = ArgmaxParams { vocab: vocab as u32, cap, chunks, _pad: 0 };
        // The LM head rows are the last n_out of the step.
        let step = Step { n_tokens: rows as u32 + 2, pos0: 0, n_out: rows as u32, out_row0: 2, ..Default::default() };
        let mut l = launch(self.kernel(), bufs, &p, step, (chunks as usize, rows));
        l.then = Some((Kernel::ArgmaxMerge, (rows as u32, 1, 1)));
        if want == Want::InputsOnly {
            return l;
        }
        // Whatever the capped values are, best must be the first maximum of what was written.
        l.post = Some(Box::new(move |out: &[Vec<u8>]| {
            let (lg, bs) = (words(&out[0]), words(&out[2]));
            for r in 0..rows {
                let row: Vec<f32> = lg[r * vocab..(r + 1) * vocab].iter().map(|&b| f32::from_bits(b)).collect();
                let first = (0..vocab).fold(0, |bi, i| if row[i] > row[bi] { i } else { bi });
                if bs[r] as usize != first {
                    return Err(format!(
                        "best[{r}] = {} but the first maximum of the written logits is at {first}",
                        bs[r]
                    ));
                }
            }
            Ok("best = first max of written logits".into())
        }));
        l
    }
}

pub fn argmax_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    let c = |vocab, rows, cap, ties, masked| ArgmaxCase { vocab, rows, cap, ties, masked };
    // 2048 / 2049 / 4097: one chunk of softcap_argmax exactly, one and a bit, two and a bit.
    for vocab in [1, 7, 255, 256, 257, 1000, 2048, 2049, 4097] {
        for cap in [30.0, 0.0] {
            v.push(Box::new(c(vocab, 3, cap, false, false)));
            if vocab > 1 {
                v.push(Box::new(c(vocab, 3, cap, true, false)));
            }
        }
    }
    for cap in [30.0, 0.0] {
        v.push(Box::new(c(1000, 2, cap, true, true)));
        v.push(Box::new(c(5000, 2, cap, true, true)));
    }
    // Gemma 4's vocabulary.
    v.push(Box::new(c(262_144, 2, 30.0, true, false)));
    v.push(Box::new(c(262_144, 1, 0.0, false, false)));
    v
}

// ---------------------------------------------------------------------------------------------
// router_topk

/// Per token: softmax of `n_experts` logits, the `top_k` largest (ties → lower index) in
/// descending order, renormalised and × per_expert_scale. Logits are uniform in
/// [-range, range); `ties` > 0 plants 1.5·range (above the rest) at that many experts per token
/// (top_k + 1 straddles the cut; n_experts = every logit equal).
#[derive(Clone, Copy)]
pub struct RouterCase {
    pub n_experts: usize,
    pub top_k: usize,
    pub tokens: usize,
    pub range: f32,
    pub ties: usize,
    /// per_expert_scale all 1 (else uniform in [0.5, 1.5)).
    pub unit_scale: bool,
    /// Expert 1's logit NaN in every token: it ranks last (never picked while k < n).
    pub nan: bool,
}

impl RouterCase {
    pub fn new(n_experts: usize, top_k: usize, tokens: usize) -> Self {
        RouterCase { n_experts, top_k, tokens, range: 1.0, ties: 0, unit_scale: false, nan: false }
    }
}

impl Case for RouterCase {
    fn kernel(&self) -> Kernel {
        Kernel::RouterTopk
    }

    fn name(&self) -> String {
        let c = self;
        let mut s = format!("router_topk(n_experts={},top_k={},tokens={}", c.n_experts, c.top_k, c.tokens);
        if c.range != 1.0 {
            s += &format!(",range={}", c.range);
        }
        if c.ties > 0 {
            s += &format!(",ties={}", c.ties);
        }
        s += if c.unit_scale { ",scale=1" } else { ",scale=rand" };
        if c.nan {
            s += ",nan=1";
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &RouterCase { n_experts: n, top_k: k, tokens, range, ties, unit_scale, nan } = self;
        assert!(k <= n && ties <= n && n <= 256 && (!nan || (k < n && n > 1)), "{}: impossible case", self.name());
        let mut logits: Vec<f32> = rng.vec(tokens * n).iter().map(|&v| v * range).collect();
        for t in 0..tokens {
            // The edges and the middle first (where the former argmax tree's halves met last),
            // then random experts.
            let mut tied: Vec<usize> = Vec::new();
            for i in [n - 1, n / 2, (n / 2).saturating_sub(1), 0] {
                if tied.len() < ties && !tied.contains(&i) {
                    tied.push(i);
                }
            }
            while tied.len() < ties {
                let i = rng.below(n);
                if !tied.contains(&i) {
                    tied.push(i);
                }
            }
            for &i in &tied {
                logits[t * n + i] = 1.5 * range;
            }
            if nan {
                logits[t * n + 1] = f32::NAN;
            }
        }
        let scale: Vec<f32> = (0..n).map(|_| if unit_scale { 1.0 } else { 1.0 + 0.5 * rng.uniform() }).collect();
        // As moe_forward: p in f64, a stable sort (ties keep the lower index first), top k.
        let (want_idx, want_w) = want
            .then(|| {
                let (mut want_idx, mut want_w) = (Vec::new(), Vec::new());
                for t in 0..tokens {
                    // A NaN logit counts as −∞: weight 0, sorted after every finite one.
                    let s: Vec<f32> = logits[t * n..(t + 1) * n]
                        .iter()
                        .map(|&v| if v.is_nan() { f32::NEG_INFINITY } else { v })
                        .collect();
                    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let p: Vec<f64> = s.iter().map(|&v| (v as f64 - m).exp()).collect();
                    let mut order: Vec<usize> = (0..n).collect();
                    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
                    let z: f64 = order[..k].iter().map(|&e| p[e]).sum();
                    for &e in &order[..k] {
                        want_idx.push(Some(e as u32));
                        want_w.push(Some(p[e] / z * scale[e] as f64));
                    }
                }
                (want_idx, want_w)
            })
            .unzip();
        let bufs = vec![
            input_words("logits", &bits(&logits)),
            input_words("scale", &bits(&scale)),
            output_u32("idx", vec![POISON; tokens * k], want_idx),
            output_f32("weight", vec![POISON; tokens * k], want_w, tol::ROUTER),
        ];
        let p = RouterParams { n_experts: n as u32, top_k: k as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(self.kernel(), bufs, &p, step, (tokens, 1))
    }
}

pub fn router_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    // 26B-A4B: 128 experts, top 8.
    for n in [1, 3, 16, 128, 256] {
        for k in [1, 2, 4, 8] {
            if k > n {
                continue;
            }
            for tokens in [1, 3, 9] {
                v.push(Box::new(RouterCase::new(n, k, tokens)));
            }
            // Ties across the cut (top_k + 1 equal maxima) and with unit scales.
            if k < n {
                v.push(Box::new(RouterCase { ties: k + 1, ..RouterCase::new(n, k, 3) }));
                v.push(Box::new(RouterCase { ties: k + 1, unit_scale: true, ..RouterCase::new(n, k, 1) }));
            }
        }
    }
    // Every logit equal: the lowest k indices, weights scale/k.
    for (n, k) in [(16, 4), (128, 8), (256, 4)] {
        v.push(Box::new(RouterCase { ties: n, ..RouterCase::new(n, k, 3) }));
    }
    v.push(Box::new(RouterCase { ties: 2, ..RouterCase::new(16, 4, 9) }));
    // A NaN logit (expert 1) among finite ones, and beside ties at the cut.
    v.push(Box::new(RouterCase { nan: true, ..RouterCase::new(128, 8, 3) }));
    v.push(Box::new(RouterCase { nan: true, ties: 5, ..RouterCase::new(16, 4, 3) }));
    // Wide logits (router scores of a trained model reach ±10s).
    for (n, k) in [(128, 8), (256, 1)] {
        v.push(Box::new(RouterCase { range: 16.0, ..RouterCase::new(n, k, 3) }));
    }
    v
}
