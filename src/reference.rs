//! The reference math: one function per kernel, written to match the math of transformers'
//! Gemma 4 (spec §2) as plainly as possible. It is the oracle every GPU kernel is tested against
//! and the arithmetic of the CPU backend and the MTP drafter, so clarity beats speed. Sums
//! accumulate in f64 so the reference is at least as accurate as any kernel it judges.
//!
//! It depends only on the config (RoPE tables) and the weight formats' dequantisation (through
//! [`MatrixRows`]), so every backend, the drafter and the tests can use it without depending on
//! each other.

/// A weight matrix as the reference reads it: rows dequantised to f32 exactly as the kernels
/// dequantise them (the loader's `Matrix` implements it).
pub trait MatrixRows {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// A name for messages (the tensor's).
    fn name(&self) -> &str;
    /// Row `r` as f32 into `out` (`cols` values).
    fn row_f32(&self, r: usize, out: &mut [f32]);
}

/// Scale applied to the token embedding: `sqrt(hidden)` rounded to the activation dtype, as
/// transformers does (`embed_scale.to(dtype)`). Kestrel computes in f32, so this is `f32(√H)`;
/// a bf16 run of transformers would use `bf16(√H)` (39.25 for E2B).
pub fn embed_scale(hidden: usize) -> f32 {
    (hidden as f64).sqrt() as f32
}

/// First index of the maximum (NaN never wins; an empty or all-NaN row gives 0): the reference of
/// softcap_argmax, and the sampler's greedy pick, so ties break identically everywhere.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in xs.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// `y = x * (mean(x²) + eps)^-½ * w` (Gemma 4 multiplies by `w`, not `1 + w`); `w = None` for the
/// scale-free norms (v_norm, router).
pub fn rmsnorm(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    for (i, v) in x.iter_mut().enumerate() {
        let y = (*v as f64 * r) as f32;
        *v = match w {
            Some(w) => y * w[i],
            None => y,
        };
    }
}

/// `rmsnorm` applied to each consecutive `n`-sized segment of `x`.
pub fn rmsnorm_rows(x: &mut [f32], n: usize, w: Option<&[f32]>, eps: f32) {
    for row in x.chunks_mut(n) {
        rmsnorm(row, w, eps);
    }
}

/// `y[t, r] = Σ_c W[r, c] · x[t, c]` for `t` tokens (`x`: `[t, cols]`, result `[t, rows]`).
pub fn matmul(w: &(impl MatrixRows + ?Sized), x: &[f32], t: usize) -> Vec<f32> {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(x.len(), t * cols, "matmul {}: x has {} values, expected {t}×{cols}", w.name(), x.len());
    let mut y = vec![0.0f32; t * rows];
    let mut row = vec![0.0f32; cols];
    for r in 0..rows {
        w.row_f32(r, &mut row);
        for ti in 0..t {
            let xs = &x[ti * cols..(ti + 1) * cols];
            let s: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
            y[ti * rows + r] = s as f32;
        }
    }
    y
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`).
pub fn gelu_tanh(x: f32) -> f32 {
    let x64 = x as f64;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x64 * (1.0 + (c * (x64 + 0.044715 * x64 * x64 * x64)).tanh())) as f32
}

/// cos/sin of one position for a rope with inverse frequencies `inv_freq` (length `d/2`).
/// As transformers: the angle is the f32 product `f32(pos) * inv_freq`, then cos/sin of that f32
/// value (computed in f64 and rounded, i.e. correctly rounded up to an ulp).
pub fn rope_table(inv_freq: &[f32], pos: usize, cos: &mut [f32], sin: &mut [f32]) {
    for (i, &f) in inv_freq.iter().enumerate() {
        let a = (pos as f32) * f;
        cos[i] = (a as f64).cos() as f32;
        sin[i] = (a as f64).sin() as f32;
    }
}

/// Rotate-half rope on one head vector `x` (length `d`), pairs `(i, i + d/2)`.
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let h = x.len() / 2;
    for i in 0..h {
        let (a, b) = (x[i], x[i + h]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i] + a * sin[i];
    }
}

/// `30 · tanh(x / 30)` (final logit softcap).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = ((*v as f64 / cap as f64).tanh() * cap as f64) as f32;
    }
}

/// Attention of one query head over keys at `positions` (scale 1.0, softmax in f64).
/// `k_at(p)` / `v_at(p)` return the cached head vectors of position `p`.
pub fn attend<'a>(
    q: &[f32],
    positions: std::ops::Range<usize>,
    k_at: impl Fn(usize) -> &'a [f32],
    v_at: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let scores: Vec<f64> =
        positions.clone().map(|p| q.iter().zip(k_at(p)).map(|(&a, &b)| a as f64 * b as f64).sum()).collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut acc = vec![0.0f64; out.len()];
    for (j, p) in positions.enumerate() {
        let w = e[j] / z;
        for (a, &v) in acc.iter_mut().zip(v_at(p)) {
            *a += w * v as f64;
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
}
