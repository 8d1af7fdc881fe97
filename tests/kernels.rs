//! Per-kernel differential tests, after llama.cpp's test-backend-ops: every WGSL kernel runs
//! alone (one dispatch through [`KernelHarness`]) on random inputs and is compared with the CPU
//! reference (`kestrel::backend::cpu::ops`, sums in f64).
//!
//! Every case prints one line that is a complete repro:
//!   `matmul_q4(rows=65,cols=320,tokens=3,gs=64) seed=123456 [wgpu]: y NMSE 1.2e-14 <= 1e-9 OK`
//! Re-run it alone with `KESTREL_KERNELS='matmul_q4(rows=65,cols=320,tokens=3,gs=64)' cargo test
//! --test kernels -- --nocapture` (the seed is derived from the name, so it comes back the same).
//!
//! Env: `KESTREL_KERNELS=<substring>` runs only the cases whose name contains it;
//! `KESTREL_SEED=<n>` replaces every case's seed; `KESTREL_REQUIRE_GPU=1` turns
//! "skipped: no adapter" into a failure (CI sets it).
//!
//! Rules every case follows:
//! - inputs are uniform in [-1, 1) from the case's seed (quantised weights go through
//!   `quant::quantize`, so kernel and reference see the same weights);
//! - outputs start POISONED (a NaN bit pattern) and are followed by a GUARD region; every word the
//!   kernel must not write (guard, padding, rows of other tokens/parts/slots) must read back
//!   unchanged, and any NaN in the compared region fails;
//! - comparison: non-finite values first (NaN fails, infinities must match in sign), then
//!   NMSE = Σ(a−b)²/Σb² against the case's threshold, each threshold argued in [`tol`];
//! - launch grids use the same formulas as `Builder::record` (src/backend/wgpu/mod.rs).
//!
//! Quick start — adding a case:
//! 1. A new shape of an existing kernel: add it to the loops of that family's `*_cases()` table.
//! 2. A new kernel: write a `struct FooCase` with the parameters, `impl Case for FooCase`:
//!    `name()` prints EVERY parameter (name + seed = the repro), `build()` makes the buffers in
//!    binding order with `input*`/`output_*` (poison and guard come with them), fills `want` from
//!    the CPU reference, and sets params/step/grid as the real program would; then add a
//!    `foo_cases()` table to `all_cases()`.
//! 3. Use a threshold from [`tol`] or add one there with its one-line argument.
//! 4. Keep the whole file under ~60 s on lavapipe in a debug build (inputs of a few MB at most).

use std::collections::BTreeMap;

use half::bf16;
use kestrel::backend::wgpu::harness::{KernelHarness, PARAMS2_AT};
use kestrel::config::Rope;
use kestrel::kernels::*;
use kestrel::loader::{FileBytes, Matrix, SafetensorsFile, TensorStore};
use kestrel::quant;
use kestrel::reference::{self, embed_scale};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

// ---------------------------------------------------------------------------------------------
// Thresholds

#[derive(Clone, Copy, Debug)]
enum Tol {
    /// Bit-identical to the reference (as f32).
    Exact,
    /// NMSE = Σ(a−b)²/Σb² at most this.
    Nmse(f64),
}

/// Every threshold with its argument. ε = 2^-24 (f32 unit roundoff); the reference is f64.
mod tol {
    use super::Tol;
    /// matmul, moe_matmul, moe_combine (K = top_k ≤ 8): f32 dot products of K ≤ 10^4 terms: relative error ~ √K·ε ≈ 6e-6 → NMSE ~ 4e-11; 25× headroom.
    pub const DOT: Tol = Tol::Nmse(1e-9);
    /// rmsnorm, head_norm_rope: one f32 sum of n ≤ 10^4 squares (as DOT) plus ≤ 5 roundings per element → NMSE ≲ 4e-11.
    pub const NORM: Tol = Tol::Nmse(1e-9);
    /// One kernel against another doing the same f32 operations in the same order, where a
    /// driver may contract a multiply and the add after it into an FMA in one and not the other
    /// (SPIR-V allows it): ≤ 1 rounding (2^-24 relative) per element and step of a norm's
    /// sums → NMSE ≲ 1e-13; 100× headroom.
    pub const SAME_OPS: Tol = Tol::Nmse(1e-11);
    /// embed of q4/q8: exact unless the driver contracts s·q+b into an FMA (SPIR-V allows it): ≤ 1 ulp of |s·q|+|b| ≤ 2, values RMS ≥ 0.3 → NMSE ≤ 1e-12.
    pub const DEQUANT: Tol = Tol::Nmse(1e-10);
    /// attention: score errors ≲ √d·ε·|s| ≈ 1e-5 (d ≤ 512, |s| ≲ 20) become relative softmax-weight errors, WGSL exp adds ≤ (3+2|x|) ulp → NMSE ≲ 1e-10.
    pub const ATTN: Tol = Tol::Nmse(1e-8);
    /// gelu_mul: tanh from exp, error ≤ ~3 ulp(1) ≈ 4e-7 absolute in (1+tanh), scaled by ½x·b ≤ ½ against values of RMS ~0.15 → NMSE ≲ 1e-12.
    pub const GELU: Tol = Tol::Nmse(1e-9);
    /// softcap: cap·tanh_stable(x/cap): 1−e cancels for small x/cap leaving e's ≤ 3 ulp(1) error, × cap/2 = 15 → ≤ 6e-6 absolute vs RMS 0.58 → NMSE ≤ 1e-10.
    pub const SOFTCAP: Tol = Tol::Nmse(1e-8);
    /// router_topk: w = e^x/Σ_k e^x · scale, x = s − max ≤ 0; the weights carrying the NMSE have |x| ≲ 4 (others < e^-4 of the top), so WGSL exp's ≤ (3+2|x|) ulp ≤ 1.3e-6 in numerator and Σ, + ≤ k+3 roundings → ≲ 3.5e-6 relative → NMSE ≲ 1.2e-11; ~100× headroom.
    pub const ROUTER: Tol = Tol::Nmse(1e-9);
}

// ---------------------------------------------------------------------------------------------
// Random inputs, poison and guards

/// The crate's splitmix64 (kestrel::synth), with the helpers the cases need.
struct Rng(kestrel::synth::SplitMix64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1), a multiple of 2^-23 (an exact f32).
    fn uniform(&mut self) -> f32 {
        self.0.uniform()
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// What every output word starts as: a quiet NaN with a recognisable payload.
const POISON: u32 = 0x7fc0_dead;
/// What follows every output buffer (a NaN too, so a stray read poisons the result).
const GUARD: u32 = 0x7fa5_a5a5;
const GUARD_WORDS: usize = 64;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// x's group sums as group_sum.wgsl leaves them for the tensor-core mat-mats: per row r of
/// `rows` (at r · stride in x), the sum of each `gs` values of its first `cols`, [rows, cols / gs]
/// (in f64; [`group_sums`] rounds them to f32 for the mat-mats' inputs).
fn group_sums_f64(x: &[f32], rows: usize, stride: usize, cols: usize, gs: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|r| (0..cols / gs).map(move |g| x[r * stride + g * gs..][..gs].iter().map(|&v| v as f64).sum()))
        .collect()
}

fn group_sums(x: &[f32], rows: usize, stride: usize, cols: usize, gs: usize) -> Vec<f32> {
    group_sums_f64(x, rows, stride, cols, gs).into_iter().map(|v| v as f32).collect()
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn to_bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

/// What a storage buffer must hold after the dispatch.
enum Check {
    /// Read-only: must come back bit-identical.
    Input,
    /// f32 output: `want[i] = Some(reference)` is compared; `None` words and the guard must be unchanged.
    F32 { want: Vec<Option<f64>>, tol: Tol },
    /// u32 output compared exactly, same rule for `None` and the guard.
    U32 { want: Vec<Option<u32>> },
    /// Scratch between the passes of a two-pass kernel: any value, only the guard is checked.
    Scratch { words: usize },
}

/// One storage binding: its name (for messages), initial bytes, and the check.
struct Buf {
    name: &'static str,
    bytes: Vec<u8>,
    check: Check,
}

fn input(name: &'static str, bytes: Vec<u8>) -> Buf {
    Buf { name, bytes, check: Check::Input }
}

fn input_words(name: &'static str, w: &[u32]) -> Buf {
    input(name, to_bytes(w))
}

/// An f32 output starting as `init` (poison, or the in/out operand), with the guard appended.
fn output_f32(name: &'static str, init: Vec<u32>, want: Vec<Option<f64>>, tol: Tol) -> Buf {
    assert_eq!(init.len(), want.len(), "{name}: init and want differ in length");
    let mut w = init;
    w.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
    Buf { name, bytes: to_bytes(&w), check: Check::F32 { want, tol } }
}

fn output_u32(name: &'static str, init: Vec<u32>, want: Vec<Option<u32>>) -> Buf {
    assert_eq!(init.len(), want.len(), "{name}: init and want differ in length");
    let mut w = init;
    w.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
    Buf { name, bytes: to_bytes(&w), check: Check::U32 { want } }
}

/// An extra check on the read-back buffers (e.g. argmax consistent with the written logits).
type PostCheck = Box<dyn Fn(&[Vec<u8>]) -> Result<String, String>>;

/// One dispatch, ready to run: buffers in binding order, params, step, grid.
struct Launch {
    kernel: Kernel,
    bufs: Vec<Buf>,
    params: Vec<u8>,
    step: Step,
    grid: (u32, u32, u32),
    /// A second dispatch on the buffers the first left (a two-pass kernel), and its grid.
    then: Option<(Kernel, (u32, u32, u32))>,
    post: Option<PostCheck>,
}

fn launch<P: bytemuck::Pod>(kernel: Kernel, bufs: Vec<Buf>, p: &P, step: Step, grid: (usize, usize)) -> Launch {
    Launch {
        kernel,
        bufs,
        params: bytemuck::bytes_of(p).to_vec(),
        step,
        grid: (grid.0 as u32, grid.1 as u32, 1),
        then: None,
        post: None,
    }
}

/// A test case: `name()` prints every parameter (with the seed, a repro), `build()` makes the launch.
trait Case {
    fn name(&self) -> String;
    fn build(&self, rng: &mut Rng) -> Launch;
}

// ---------------------------------------------------------------------------------------------
// Comparison

/// Compares `got` with the reference: non-finite values first, then NMSE (returned).
fn compare(got: &[f32], want: &[f64], tol: Tol) -> Result<f64, String> {
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(!b.is_nan(), "reference is NaN at {i}: a bug in the test");
        if a.is_nan() {
            let what = if a.to_bits() == POISON { " (poison: never written)" } else { "" };
            return Err(format!("element {i} is NaN{what}, reference {b:e}"));
        }
        if (a.is_infinite() || b.is_infinite()) && a as f64 != b {
            return Err(format!("element {i} is {a:e}, reference {b:e}"));
        }
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&a, &b) in got.iter().zip(want) {
        if b.is_finite() {
            num += (a as f64 - b).powi(2);
            den += b * b;
        }
    }
    let nmse = if den > 0.0 {
        num / den
    } else if num == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    match tol {
        Tol::Exact => {
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != (want[i] as f32).to_bits()) {
                return Err(format!("element {i} is {:e}, reference {:e} (must be exact)", got[i], want[i]));
            }
        }
        Tol::Nmse(max) => {
            if nmse > max {
                return Err(format!("NMSE = {nmse:.2e} > {max:.0e}"));
            }
        }
    }
    Ok(nmse)
}

/// Every word outside the compared region (`compared(i)` false, or past the end: the guard) must be
/// as it was.
fn untouched(
    name: &str,
    got: &[u32],
    init: &[u32],
    len: usize,
    compared: impl Fn(usize) -> bool,
) -> Result<(), String> {
    for (i, (&g, &w)) in got.iter().zip(init).enumerate() {
        if g != w && !(i < len && compared(i)) {
            return Err(if i >= len {
                format!("{name}: guard word {} past the end overwritten (0x{g:08x})", i - len)
            } else {
                format!("{name}: word {i} outside the compared region written (0x{w:08x} -> 0x{g:08x})")
            });
        }
    }
    Ok(())
}

/// Runs one launch and checks every buffer. Ok: the report and the largest NMSE.
fn run_case(h: &mut KernelHarness, l: &Launch) -> Result<(String, f64), String> {
    let init: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
    let mut out = h.run(l.kernel, &init, &l.params, l.step, l.grid).map_err(|e| format!("dispatch failed: {e}"))?;
    if let Some((kernel, grid)) = l.then {
        out = h.run(kernel, &out, &l.params, l.step, grid).map_err(|e| format!("second pass failed: {e}"))?;
    }
    let mut parts = Vec::new();
    let mut worst = 0.0f64;
    for (b, got) in l.bufs.iter().zip(&out) {
        match &b.check {
            Check::Input => {
                if *got != b.bytes {
                    return Err(format!("{}: read-only input changed", b.name));
                }
            }
            Check::F32 { want, tol } => {
                let (g, w0) = (words(got), words(&b.bytes));
                untouched(b.name, &g, &w0, want.len(), |i| want[i].is_some())?;
                let (a, r): (Vec<f32>, Vec<f64>) =
                    want.iter().enumerate().filter_map(|(i, w)| w.map(|w| (f32::from_bits(g[i]), w))).unzip();
                let nmse = compare(&a, &r, *tol).map_err(|e| format!("{}: {e}", b.name))?;
                worst = worst.max(nmse);
                parts.push(match tol {
                    Tol::Exact => format!("{} exact ({} values)", b.name, a.len()),
                    Tol::Nmse(max) => format!("{} NMSE {nmse:.1e} <= {max:.0e}", b.name),
                });
            }
            Check::U32 { want } => {
                let (g, w0) = (words(got), words(&b.bytes));
                untouched(b.name, &g, &w0, want.len(), |i| want[i].is_some())?;
                for (i, w) in want.iter().enumerate() {
                    if let Some(w) = w {
                        if g[i] != *w {
                            return Err(format!("{}[{i}] = {} (0x{:08x}), expected {w}", b.name, g[i], g[i]));
                        }
                    }
                }
                parts.push(format!("{} exact", b.name));
            }
            Check::Scratch { words: n } => {
                let (g, w0) = (words(got), words(&b.bytes));
                untouched(b.name, &g, &w0, *n, |_| true)?;
            }
        }
    }
    if let Some(post) = &l.post {
        parts.push(post(&out)?);
    }
    Ok((parts.join(", "), worst))
}

// ---------------------------------------------------------------------------------------------
// Weights as the loader sees them

/// A weight matrix in one format: the loader's `Matrix` (the reference reads it with `row_f32`)
/// and the bytes the GPU gets.
struct Weights {
    matrix: Matrix,
    /// w, scales, biases (the last two empty for float formats).
    bytes: [Vec<u8>; 3],
    row_bytes: [usize; 3],
}

impl Weights {
    fn new(fmt: Format, rows: usize, cols: usize, gs: usize, rng: &mut Rng) -> Weights {
        let w = rng.vec(rows * cols);
        match fmt {
            Format::Q4 | Format::Q8 => {
                let bits = if fmt == Format::Q4 { 4 } else { 8 };
                let q = quant::quantize(&w, rows, cols, bits, gs);
                let wb = to_bytes(&q.words);
                let (sb, bb) = (bf16_bytes(&q.scales), bf16_bytes(&q.biases));
                let wshape = vec![rows, cols * bits as usize / 32];
                let gshape = vec![rows, cols / gs];
                let st = store(&[
                    ("w", Dtype::U32, wshape, &wb),
                    ("s", Dtype::BF16, gshape.clone(), &sb),
                    ("b", Dtype::BF16, gshape, &bb),
                ]);
                let matrix = Matrix::Quant {
                    w: st.get("w").unwrap(),
                    scales: st.get("s").unwrap(),
                    biases: st.get("b").unwrap(),
                    layout: q.layout,
                };
                let g = 2 * cols / gs;
                Weights { matrix, bytes: [wb, sb, bb], row_bytes: [cols * bits as usize / 8, g, g] }
            }
            Format::Bf16 | Format::F32 => {
                let (dt, wb) = if fmt == Format::Bf16 {
                    (Dtype::BF16, bf16_bytes(&w.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>()))
                } else {
                    (Dtype::F32, to_bytes(&bits(&w)))
                };
                let st = store(&[("w", dt, vec![rows, cols], &wb)]);
                let matrix = Matrix::Float { t: st.get("w").unwrap(), rows, cols };
                let esize = wb.len() / (rows * cols);
                Weights { matrix, bytes: [wb, Vec::new(), Vec::new()], row_bytes: [esize * cols, 0, 0] }
            }
        }
    }

    /// The GPU buffers of rows [row0, row0 + n) (one part of a split matrix); the unused scales
    /// and biases of float formats are one dummy word, as in the real program.
    fn part(&self, row0: usize, n: usize) -> [Vec<u8>; 3] {
        std::array::from_fn(|k| {
            let rb = self.row_bytes[k];
            if rb == 0 {
                vec![0; 4]
            } else {
                self.bytes[k][row0 * rb..(row0 + n) * rb].to_vec()
            }
        })
    }
}

/// An in-memory safetensors file (leaked: the loader's `FileBytes::Static`; a few MB per run).
fn store(tensors: &[(&str, Dtype, Vec<usize>, &[u8])]) -> TensorStore {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, dt, shape, data)| (n.to_string(), TensorView::new(*dt, shape.clone(), data).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    let file = SafetensorsFile::from_bytes(
        "kernels-test.safetensors".into(),
        FileBytes::Static(Box::leak(bytes.into_boxed_slice())),
    )
    .unwrap();
    TensorStore::from_files(vec![file])
}

fn is_quant(fmt: Format) -> bool {
    matches!(fmt, Format::Q4 | Format::Q8)
}

const EPS: f32 = 1e-6;

// ---------------------------------------------------------------------------------------------
// matmul

/// `y[t, y_off + r] = W[r] · x[t]`; defaults: x_stride = cols, y_off = 0, y_stride = rows,
/// count_sel 0 (count = tokens).
#[derive(Clone, Copy)]
struct MatmulCase {
    fmt: Format,
    rows: usize,
    cols: usize,
    tokens: usize,
    gs: usize,
    x_pad: usize,
    y_off: usize,
    y_pad: usize,
    /// Some(n): count_sel 1 (the LM head), count = step.n_out = n.
    n_out: Option<usize>,
    /// Token tile of the pipeline variant (`TOK` in matmul.wgsl): 1 (decode), 4 (verify) or 8 (chunks).
    tile: usize,
    /// Run the 4-bit mat-vec (qmv.wgsl, the backend's decode/verify variant for Q4) instead.
    qmv: bool,
    /// Run the 4-bit prefill mat-mat (qmm.wgsl, the backend's chunk variant for Q4) with this
    /// many rows per thread (TM) instead.
    qmm: Option<u32>,
    /// With `qmm`: its tensor-core form (qmm_coop.wgsl) with this tile (TB, RB) instead.
    coop: Option<(u32, u32)>,
    /// x values spread over 2^-20 … 2^19 inside each 32-value chunk, with exact zeros (the
    /// staged qmv loop keeps 22 bits below a chunk's largest |x|: its small values lose the most).
    x_spread: bool,
}

impl MatmulCase {
    fn new(fmt: Format, rows: usize, cols: usize, tokens: usize, gs: usize) -> Self {
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &MatmulCase { fmt, rows, cols, tokens, gs, x_pad, y_off, y_pad, n_out, tile, qmv, qmm, coop, x_spread } =
            self;
        let w = Weights::new(fmt, rows, cols, gs, rng);
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
        let y_ref = reference::matmul(&w.matrix, &xs, count);
        let mut want = vec![None; tokens * y_stride];
        for t in 0..count {
            for r in 0..rows {
                want[t * y_stride + y_off + r] = Some(y_ref[t * rows + r] as f64);
            }
        }
        let [wb, sb, bb] = w.part(0, rows);
        let mut bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &x),
            output_f32("y", vec![POISON; tokens * y_stride], want, tol::DOT),
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
        let (kernel, rows_per_wg) = if qmv {
            qmv_shape(rows, cols, x_stride, tile as u32).expect("qmv applies to this case")
        } else if let Some(tm) = qmm {
            assert!(qmm_applies(fmt, cols, x_stride) && tile == QMM_TOK as usize);
            match coop {
                Some((tb, rb)) => (Kernel::QmmCoop { tb, rb }, 32 * rb),
                None => (Kernel::Qmm { tm }, 16 * tm),
            }
        } else {
            (Kernel::Matmul(fmt, tile as u32), matmul_rows(tile as u32))
        };
        let tok_tile = coop.map_or(tile, |(tb, _)| 64 * tb as usize);
        let grid = (rows.div_ceil(rows_per_wg as usize), count.div_ceil(tok_tile));
        let mut l = launch(kernel, bufs, &p, step, grid);
        if rows == 257 || rows == 1100 {
            // Fold x into x·z as the backend does past 65535 workgroups (here past 16): e.g. the
            // 65 row blocks of matmul become 17 × 4 (3 blocks past the end that must write
            // nothing), qmm's 18 (TM 4) or 9 (TM 8) blocks of 1100 rows 9 × 2 or 5 × 2.
            let (x, z) = fold_grid(l.grid.0, 16);
            l.grid = (x, l.grid.1, z);
        }
        l
    }
}

fn matmul_cases() -> Vec<Box<dyn Case>> {
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
    v.extend(qmm_cases());
    v
}

/// The 4-bit prefill mat-mat: partial row and token tiles (rows 1, 63, 65, 130; tokens 1, 9, 64,
/// 65, 130), several 32-value steps per group (cols 320: 5 groups of 64, 10 steps) and group
/// size 128, a strided x, a later part, count = n_out (the LM head), a folded grid.
fn qmm_cases() -> Vec<Box<dyn Case>> {
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
fn qmm_shapes(q: impl Fn(usize, usize, usize) -> MatmulCase) -> Vec<Box<dyn Case>> {
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
    let Some(mut h) = harness() else { return };
    assert!(h.gpu().coop_f16(), "{} has no f16 cooperative matrices: qmm_coop cannot run here", h.gpu().describe());
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
    let failures = run_all(&mut h, dense.chain(moe).chain(glu));
    assert!(failures.is_empty(), "{} qmm_coop case(s) failed:\n{}", failures.len(), failures.join("\n"));
    for ((splits, c), t) in split_k_cases().into_iter().zip(tiles.into_iter().cycle()) {
        run_split_k(&mut h, splits, MatmulCase { coop: Some(t), ..c });
    }
}

/// Runs each case (seeded by its name), printing a line per case; returns the failures' lines.
fn run_all(h: &mut KernelHarness, cases: impl Iterator<Item = Box<dyn Case>>) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let name = case.name();
        let seed = seed_of(&name);
        let l = case.build(&mut Rng(kestrel::synth::SplitMix64(seed)));
        match run_case(h, &l) {
            Ok((report, _)) => println!("{name} seed={seed} [wgpu]: {report} OK"),
            Err(e) => failures.push(format!("{name} seed={seed} [wgpu]: FAIL {e}")),
        }
    }
    failures
}

/// Chunk attention on tensor cores (attention_coop.wgsl) on attention's cases whose head dim it
/// takes (a multiple of 64), and at full size: E4B's sliding layers (d 256, 8:2, window 512)
/// over a first 512-token chunk and a later one in a wrapped ring, E2B's global layers (d 512,
/// 8:1) over a longer context, and q ranges from near-uniform weights to weights so peaked that
/// the running maximum moves on most tiles (O rescaled). Needs f16 cooperative matrices, as
/// qmm_coop's test. Same tolerance as attention: the f16 halves leave ~2^-21 of each product
/// (attention_coop.wgsl), far inside tol::ATTN.
#[test]
#[ignore = "needs f16 cooperative matrices (tensor cores): run with --include-ignored on such a device"]
fn attention_coop_matches_the_cpu_reference() {
    let Some(mut h) = harness() else { return };
    assert!(
        h.gpu().coop_f16(),
        "{} has no f16 cooperative matrices: attention_coop cannot run here",
        h.gpu().describe()
    );
    let mut cases: Vec<AttnCase> =
        attention_shapes().into_iter().filter(|c| attention_chunk_coop(c.d).is_some()).collect();
    let a = AttnCase::new;
    cases.extend([a(256, 8, 2, 512, 0, 512, 1023), a(256, 8, 2, 512, 700, 512, 1023), a(512, 8, 1, 300, 400, 0, 700)]);
    for q_range in [0.01, 4.0, 16.0] {
        cases.extend([a(256, 4, 1, 100, 50, 0, 150), a(64, 4, 2, 70, 30, 16, 85)].map(|c| AttnCase { q_range, ..c }));
    }
    // Each case in both forms: the plain one, and the one that also writes the output's sums.
    let cases = cases
        .into_iter()
        .flat_map(|c| [false, true].map(|sums| Box::new(AttnCase { coop: true, sums, ..c }) as Box<dyn Case>));
    let failures = run_all(&mut h, cases);
    assert!(failures.is_empty(), "{} attention_coop case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// Split-k qmm (qmm.wgsl with k_splits > 1, then qmm_sum.wgsl), as the backend runs few-row
/// matrices in chunks, against the same CPU reference as the unsplit kernel: 2, 4 and 8 ranges,
/// both row tiles, partial row and token tiles, a later part of a strided y, count = n_out.
#[test]
fn split_k_qmm_matches_the_cpu_reference() {
    let Some(mut h) = harness() else { return };
    for (splits, c) in split_k_cases() {
        run_split_k(&mut h, splits, c);
    }
}

/// The split-k cases: (ranges, case).
fn split_k_cases() -> [(u32, MatmulCase); 5] {
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

/// Runs case `c` split into `splits` k ranges, then qmm_sum, and checks y against the reference.
fn run_split_k(h: &mut KernelHarness, splits: u32, c: MatmulCase) {
    let name = format!("{} k_splits={splits}", c.name());
    let l = c.build(&mut Rng(kestrel::synth::SplitMix64(seed_of(&name))));
    let Check::F32 { want, tol } = &l.bufs[4].check else { unreachable!("matmul's y is an f32 output") };
    let mut p: MatmulParams = *bytemuck::from_bytes(&l.params[..std::mem::size_of::<MatmulParams>()]);
    let count = c.n_out.unwrap_or(c.tokens);
    let scratch = vec![0u8; 4 * splits as usize * count * c.rows];
    let split_p = MatmulParams { y_stride: p.rows, y_off: 0, k_splits: splits, ..p };
    // w, scales, biases, x, the partials in y's place, then x's group sums (the tensor-core form).
    let bufs: Vec<Vec<u8>> = l.bufs[..4]
        .iter()
        .map(|b| b.bytes.clone())
        .chain([scratch])
        .chain(l.bufs[5..].iter().map(|b| b.bytes.clone()))
        .collect();
    let grid = (l.grid.0, l.grid.1 * splits, l.grid.2);
    let out = h.run(l.kernel, &bufs, bytemuck::bytes_of(&split_p), l.step, grid).unwrap();
    p.k_splits = splits;
    let sum_grid = ((c.rows as u32).div_ceil(256), count as u32, 1);
    let y = h
        .run(Kernel::QmmSum, &[out[4].clone(), l.bufs[4].bytes.clone()], bytemuck::bytes_of(&p), l.step, sum_grid)
        .unwrap();
    let got: Vec<f32> = words(&y[1]).into_iter().map(f32::from_bits).collect();
    // Every y value the reference leaves out must keep its poison (nothing written past the rows).
    let init: Vec<u32> = words(&l.bufs[4].bytes);
    untouched(&name, &words(&y[1]), &init, want.len(), |i| want[i].is_some()).unwrap();
    let (g, r): (Vec<f32>, Vec<f64>) = want.iter().zip(&got).filter_map(|(w, &g)| w.map(|w| (g, w))).unzip();
    match compare(&g, &r, *tol) {
        Ok(nmse) => println!("{name} [wgpu]: y NMSE {nmse:.1e} OK"),
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The 4-bit mat-vec of decode (tile 1) and verify (tile 4) steps: every lane count of
/// `qmv_shape` (8: cols 320 → 10 chunks; 16: cols 1024; 32: cols 1536 → 48 chunks, so lanes idle
/// on the second pass; 64: cols 2560; 128: cols 6144), every rows-per-team (1; 2: rows 3000;
/// 4: rows 4100), the tall rules (16 lanes × 2 rows at 12300 rows, 16 × 8 at 12290 rows of
/// 16384 values, 8 × 4 for the LM head at 65536), x staged (34 chunks on 16 lanes, 20 on 8) and
/// not, x spread over 40 binades, partial row blocks, group size 128, a strided x, a later part,
/// count = n_out, a folded grid.
fn qmv_cases() -> Vec<Box<dyn Case>> {
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
struct GluCase {
    rows: usize,
    cols: usize,
    tokens: usize,
    tile: usize,
    /// The prefill form on tensor cores (qmm_coop_glu.wgsl) instead of qmv_glu (`tile` unused).
    coop: bool,
}

impl Case for GluCase {
    fn name(&self) -> String {
        let kind = if self.coop { "qmm_coop_glu_q4".to_string() } else { format!("qmv_glu_q4_t{}", self.tile) };
        format!("{kind}(rows={},cols={},tokens={})", self.rows, self.cols, self.tokens)
    }

    fn build(&self, rng: &mut Rng) -> Launch {
        let &GluCase { rows, cols, tokens, tile, coop } = self;
        let w = Weights::new(Format::Q4, 2 * rows, cols, 64, rng);
        let xs = rng.vec(tokens * cols);
        let y_ref = reference::matmul(&w.matrix, &xs, tokens);
        let y_stride = 2 * rows;
        let mut want = vec![None; tokens * y_stride];
        for t in 0..tokens {
            for r in 0..rows {
                let (g, u) = (y_ref[t * 2 * rows + r], y_ref[t * 2 * rows + rows + r]);
                want[t * y_stride + r] = Some(reference::gelu_tanh(g) as f64 * u as f64);
            }
        }
        let [wb, sb, bb] = w.part(0, 2 * rows);
        let mut bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &bits(&xs)),
            // gelu(g)·u: the dot products' error (tol::DOT) times |gelu'| ≤ 1.13, plus one product.
            output_f32("y", vec![POISON; tokens * y_stride], want, tol::DOT),
        ];
        if coop {
            bufs.push(input_words("xsum", &bits(&group_sums(&xs, tokens, cols, cols, 64))));
            // Each token's sums of y over 64-row groups (the last one partial where rows is no
            // multiple of 64): sums of ≤ 64 values carrying tol::DOT's error.
            let groups = rows.div_ceil(64);
            let mut want_s = vec![None; tokens * groups];
            for t in 0..tokens {
                for g in 0..groups {
                    want_s[t * groups + g] = Some(
                        (g * 64..rows.min(g * 64 + 64))
                            .map(|r| {
                                reference::gelu_tanh(y_ref[t * 2 * rows + r]) as f64
                                    * y_ref[t * 2 * rows + rows + r] as f64
                            })
                            .sum(),
                    );
                }
            }
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
        if coop {
            let (kernel, per_wg, tok) = qmm_coop_glu_shape();
            return launch(kernel, bufs, &p, step, (rows.div_ceil(per_wg as usize), tokens.div_ceil(tok as usize)));
        }
        let (kernel, rows_per_wg) =
            qmv_glu_shape(rows, cols, cols, tile as u32, &Tuning::default()).expect("qmv_glu applies to this case");
        launch(kernel, bufs, &p, step, (rows.div_ceil(rows_per_wg as usize), tokens.div_ceil(tile)))
    }
}

/// The fused-norm mat-vec (qmv.wgsl with qmv_norm.wgsl's prologue): per token,
/// `h = (res + norm(a) · w1) · post1` is written to res_out, and the plain or GeGLU mat-vec
/// multiplies `norm(h) · w2 · post2` (`second`) or `h`. The norm weights sit at odd offsets of
/// a wider buffer (as in the backend's one buffer of all norm weights).
#[derive(Clone, Copy)]
struct NormQmvCase {
    rows: usize,
    cols: usize,
    tokens: usize,
    tile: usize,
    second: bool,
    glu: bool,
    /// The float loop over the normed x (`Tuning::qmv_digits` off) instead of its integer digits.
    floats: bool,
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &NormQmvCase { rows, cols, tokens, tile, second, glu, floats } = self;
        let tuning = Tuning { qmv_digits: !floats, ..Tuning::default() };
        let w_rows = if glu { 2 * rows } else { rows };
        let w = Weights::new(Format::Q4, w_rows, cols, 64, rng);
        let (a, res) = (rng.vec(tokens * cols), rng.vec(tokens * cols));
        // Offsets past the buffer's start, multiples of 4 (read as vec4, the host aligns them).
        let (w1_off, w2_off) = (8, 8 + cols + 4);
        let nw: Vec<f32> = (0..w2_off + cols + 4).map(|_| 0.5 + 0.5 * (rng.uniform() + 1.0)).collect();
        let (post1, post2, eps) = (0.75f32, 1.25f32, 1e-6f32);
        // The reference: rmsnorm (ops) in f64 sums, then the mat-vec of the normed rows.
        let mut hs = Vec::with_capacity(tokens * cols);
        let mut vs = Vec::with_capacity(tokens * cols);
        for t in 0..tokens {
            let mut n1 = a[t * cols..(t + 1) * cols].to_vec();
            reference::rmsnorm(&mut n1, Some(&nw[w1_off..w1_off + cols]), eps);
            let h: Vec<f32> = n1.iter().zip(&res[t * cols..(t + 1) * cols]).map(|(&n, &r)| (n + r) * post1).collect();
            let mut v = h.clone();
            if second {
                reference::rmsnorm(&mut v, Some(&nw[w2_off..w2_off + cols]), eps);
                v.iter_mut().for_each(|x| *x *= post2);
            }
            hs.extend(h);
            vs.extend(v);
        }
        let y_ref = reference::matmul(&w.matrix, &vs, tokens);
        let y_stride = w_rows;
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
        let [wb, sb, bb] = w.part(0, w_rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("a", &bits(&a)),
            // The normed input's error (tol::NORM, relative ~1e-7 per value) passes through the
            // dot products as their own rounding does: tol::DOT covers both.
            output_f32("y", vec![POISON; tokens * y_stride], want, tol::DOT),
            input_words("res", &bits(&res)),
            input_words("norm weights", &bits(&nw)),
            output_f32("res_out", vec![POISON; tokens * cols], hs.iter().map(|&v| Some(v as f64)).collect(), tol::NORM),
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
        let (kernel, rows_per_wg) = if glu {
            qmv_glu_shape(rows, cols, cols, tile as u32, &tuning)
        } else {
            qmv_shape(rows, cols, cols, tile as u32)
        }
        .expect("qmv applies to this case");
        let kernel = with_norm(kernel, tile as u32, cols, 32768, &tuning)
            .expect("the fused form fits in lavapipe's workgroup memory");
        let grid = (rows.div_ceil(rows_per_wg as usize) as u32, tokens.div_ceil(tile) as u32, 1);
        Launch { kernel, bufs, params, step, grid, then: None, post: None }
    }
}

fn norm_qmv_cases() -> Vec<Box<dyn Case>> {
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
struct GeluBCase {
    rows: usize,
    cols: usize,
    tokens: usize,
    tile: usize,
}

impl Case for GeluBCase {
    fn name(&self) -> String {
        format!("qmv_gelu_b_q4_t{}(rows={},cols={},tokens={})", self.tile, self.rows, self.cols, self.tokens)
    }

    fn build(&self, rng: &mut Rng) -> Launch {
        let &GeluBCase { rows, cols, tokens, tile } = self;
        let w = Weights::new(Format::Q4, rows, cols, 64, rng);
        let xs = rng.vec(tokens * cols);
        let (b_stride, b_off) = (3 * rows + 5, rows + 2);
        let gb = rng.vec(tokens * b_stride);
        let y_ref = reference::matmul(&w.matrix, &xs, tokens);
        let mut want = vec![None; tokens * rows];
        for t in 0..tokens {
            for r in 0..rows {
                want[t * rows + r] =
                    Some(reference::gelu_tanh(y_ref[t * rows + r]) as f64 * gb[t * b_stride + b_off + r] as f64);
            }
        }
        let [wb, sb, bb] = w.part(0, rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("x", &bits(&xs)),
            // gelu(y)·b: the dot product's error (tol::DOT) times |gelu'| ≤ 1.13 and |b| < 1.
            output_f32("y", vec![POISON; tokens * rows], want, tol::DOT),
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
        let (kernel, rows_per_wg) =
            qmv_gelu_b_shape(rows, cols, cols, tile as u32).expect("the gated qmv applies to this case");
        launch(kernel, bufs, &p, step, (rows.div_ceil(rows_per_wg as usize), tokens.div_ceil(tile)))
    }
}

/// Partial team blocks (rows 1, 7, 65), one and two pairs per team (rows 3000 → 6000 stacked
/// rows), the lane counts of E2B/E4B widths (cols 1536, 2560) and the down-width 6144.
fn glu_cases() -> Vec<Box<dyn Case>> {
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
    let Some(mut h) = harness() else { return };
    let c = MatmulCase { tile: 1, qmv: true, ..MatmulCase::new(Format::Q4, 12300, 1088, 3, 64) };
    let l = c.build(&mut Rng(kestrel::synth::SplitMix64(5)));
    let mut bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
    let clean: Vec<f32> =
        words(&h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[4]).into_iter().map(f32::from_bits).collect();
    assert!(clean[..3 * 12300].iter().all(|v| v.is_finite()), "non-finite rows from a finite x");
    // Token 0: +inf at column 40; token 1: NaN at column 1000; token 2 untouched.
    bufs[3][4 * 40..4 * 41].copy_from_slice(&f32::INFINITY.to_le_bytes());
    bufs[3][4 * (1088 + 1000)..4 * (1088 + 1001)].copy_from_slice(&f32::NAN.to_le_bytes());
    let got: Vec<f32> =
        words(&h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[4]).into_iter().map(f32::from_bits).collect();
    for t in 0..2 {
        let finite = got[t * 12300..(t + 1) * 12300].iter().filter(|v| v.is_finite()).count();
        assert_eq!(finite, 0, "token {t}: {finite} of 12300 rows finite with a non-finite x");
    }
    let changed: Vec<(usize, f32, f32)> = (2 * 12300..3 * 12300)
        .filter(|&i| got[i].to_bits() != clean[i].to_bits())
        .map(|i| (i, clean[i], got[i]))
        .take(5)
        .collect();
    assert!(changed.is_empty(), "token 2's rows changed: {changed:?}");
}

/// The same for the routed experts' loop on integer digits (qmv_moe.wgsl with qmv_digits.wgsl,
/// the 26B's 2816-wide gate/up input shared by the slots): every row of a token whose x holds an
/// inf or a NaN is non-finite, the other token's rows are unchanged.
#[test]
fn qmv_moe_digit_rows_carry_a_non_finite_x() {
    let Some(mut h) = harness() else { return };
    let c = MoeMatmulCase { qmv: true, ..MoeMatmulCase::new(Format::Q4, 9, 8, 9, 2816, 3) };
    let l = c.build(&mut Rng(kestrel::synth::SplitMix64(5)));
    assert!(l.kernel.label().ends_with("_i"), "{} is not the digits form", l.kernel.label());
    let mut bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
    let f32s = |b: &[u8]| -> Vec<f32> { words(b).into_iter().map(f32::from_bits).collect() };
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
}

/// Decode and verify run different token tiles of qmv (1 for decode, 2–4 for a verify of as many
/// tokens): a row's result must not depend on the tile (the speculative path's logits are
/// bitwise a decode's).
#[test]
fn qmv_rows_are_bitwise_equal_across_token_tiles() {
    let Some(mut h) = harness() else { return };
    for (rows, cols) in [(65, 320), (33, 1536), (41, 2560), (12300, 1088)] {
        let outs: Vec<Vec<u8>> = (1..=MATMUL_VERIFY_TOK as usize)
            .map(|tile| {
                let c = MatmulCase { tile, qmv: true, ..MatmulCase::new(Format::Q4, rows, cols, 3, 64) };
                let l = c.build(&mut Rng(kestrel::synth::SplitMix64(11)));
                let bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
                let out = h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap();
                out[4].clone()
            })
            .collect();
        for (tile, o) in outs.iter().enumerate().skip(1) {
            assert!(outs[0] == *o, "qmv rows={rows} cols={cols}: tile 1 and tile {} differ", tile + 1);
        }
    }
    // The GeGLU form: the same for its gate/up rows.
    for (rows, cols) in [(65, 320), (70, 1536), (6150, 1088)] {
        let outs: Vec<Vec<u8>> = (1..=MATMUL_VERIFY_TOK as usize)
            .map(|tile| {
                let l = GluCase { rows, cols, tokens: 3, tile, coop: false }
                    .build(&mut Rng(kestrel::synth::SplitMix64(11)));
                let bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
                h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap()[4].clone()
            })
            .collect();
        for (tile, o) in outs.iter().enumerate().skip(1) {
            assert!(outs[0] == *o, "qmv_glu rows={rows} cols={cols}: tile 1 and tile {} differ", tile + 1);
        }
    }
    // The fused-norm forms (their loop on the prologue's integer digits, qmv_digits.wgsl, or with
    // `floats` on the normed x itself): the normed input and the updated residual too. At 1536
    // columns a lane's second chunk is clamped on its last round.
    for (glu, floats) in [(false, false), (true, false), (false, true), (true, true)] {
        for (rows, cols) in [(65, 320), (70, 1536), (40, 2816)] {
            let outs: Vec<(Vec<u8>, Vec<u8>)> = [1, PRO_VERIFY_TOK as usize]
                .iter()
                .map(|&tile| {
                    let l = NormQmvCase { rows, cols, tokens: 3, tile, second: true, glu, floats }
                        .build(&mut Rng(kestrel::synth::SplitMix64(11)));
                    let bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
                    let out = h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap();
                    (out[4].clone(), out[7].clone())
                })
                .collect();
            assert!(
                outs[0] == outs[1],
                "fused-norm qmv (glu {glu}, floats {floats}) rows={rows} cols={cols}: tile 1 and tile {PRO_VERIFY_TOK} differ"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// embed

/// `out[t] = scale · E[ids[t]]` for ids in the part [row0, row0 + rows) of a `table`-row matrix.
struct EmbedCase {
    fmt: Format,
    table: usize,
    row0: usize,
    rows: usize,
    cols: usize,
    tokens: usize,
    gs: usize,
    scale: f32,
}

impl Case for EmbedCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &EmbedCase { fmt, table, row0, rows, cols, tokens, gs, scale } = self;
        let w = Weights::new(fmt, table, cols, gs, rng);
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
        let mut want = vec![None; tokens * cols];
        let mut row = vec![0.0f32; cols];
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if (row0..end).contains(&id) {
                w.matrix.row_f32(id, &mut row);
                for c in 0..cols {
                    want[t * cols + c] = Some((row[c] * scale) as f64);
                }
            }
        }
        let tol = if is_quant(fmt) { tol::DEQUANT } else { Tol::Exact };
        let [wb, sb, bb] = w.part(row0, rows);
        let bufs = vec![
            input("w", wb),
            input("scales", sb),
            input("biases", bb),
            input_words("ids", &ids),
            output_f32("out", vec![POISON; tokens * cols], want, tol),
        ];
        let p =
            EmbedParams { rows: rows as u32, cols: cols as u32, gs: gs as u32, row0: row0 as u32, scale, _pad: [0; 3] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(Kernel::Embed(fmt), bufs, &p, step, ((cols / 8).div_ceil(64), tokens))
    }
}

fn embed_cases() -> Vec<Box<dyn Case>> {
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
// rmsnorm

/// `out[t, s] = ((mode 1 ? out : 0) + norm(x[t', s] · pre) · w) · post`; defaults: segs 1,
/// pre = post = 1, weight at w_off 0, x_stride = out_stride = segs·n, x_row_sel = count_sel = 0.
#[derive(Clone, Copy)]
struct NormCase {
    n: usize,
    segs: usize,
    tokens: usize,
    mode: u32,
    pre: f32,
    post: f32,
    weight: bool,
    w_off: usize,
    x_pad: usize,
    out_pad: usize,
    /// Some(n): x_row_sel 1 and count_sel 1 (the final norm of the LM head rows).
    n_out: Option<usize>,
    /// Some(pad): chain ≥ 1, out2[t] = norm(out[t]) · w2 with out2_stride = n + pad.
    chain: Option<usize>,
    /// Chained outputs (1..=3) when `chain` is Some: out3, out4 with weights w3, w4 and posts.
    chained: usize,
    /// Threads per workgroup: 512 is the backend's decode form where the device allows it
    /// (`kernels::rmsnorm`), 256 elsewhere; 1024 with `KESTREL_RMSNORM_WG`.
    wg: u32,
    /// Some(gs) (the rows form only): also writing every output's sums over groups of gs
    /// values (`RmsNormRows { sums: true }`).
    sums: Option<usize>,
    /// Some(wg): the chunk norms' rows form (`RmsNormRows`, rmsnorm_rows.wgsl) on wg threads per
    /// row; its weights then start at multiples of 4 (rows of vec4).
    rows: Option<u32>,
    /// > 1 (the rows form only): x read as the sum of this many split-k partials (qmm_sum's
    /// layout and order); x itself is poison.
    splits: usize,
}

impl NormCase {
    fn new(n: usize, tokens: usize, mode: u32) -> Self {
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
            rows: None,
            splits: 0,
        }
    }

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
}

/// Where output j's group sums start in the norm case's xsum buffer (3 words of poison first:
/// an offset that is no multiple of anything), and its length.
fn norm_sums_layout(count: usize, groups: usize, outputs: usize) -> (impl Fn(usize) -> usize, usize) {
    (move |j: usize| 3 + j * count * groups, 3 + outputs * count * groups)
}

impl Case for NormCase {
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
            s += &format!(",sums,gs={gs}");
        }
        if let Some(wg) = c.rows {
            s += &format!(",rows,wg={wg}");
        }
        if c.splits > 1 {
            s += &format!(",splits={}", c.splits);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng) -> Launch {
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
                        let resid = rng.uniform();
                        if mode == 1 {
                            out[ob + i] = resid.to_bits();
                        } else {
                            res[ob + i] = resid.to_bits();
                        }
                        y += resid as f64;
                    }
                    want[ob + i] = Some(y * post as f64);
                }
            }
        }
        // The chained norms, from the expected out rows rounded to f32 (what the kernel holds).
        let out2_stride = n + chain.unwrap_or(0);
        let n_chained = if chain.is_some() { chained } else { 0 };
        let mut bufs =
            vec![input_words("x", &x), input_words("wt", &wt), output_f32("out", out, want.clone(), tol::NORM)];
        for (j, name) in ["out2", "out3", "out4"].into_iter().enumerate() {
            bufs.push(if j < n_chained {
                let mut want2 = vec![None; count * out2_stride];
                for t in 0..count {
                    let mut v: Vec<f32> =
                        (0..n).map(|i| want[t * out_stride + i].expect("row written") as f32).collect();
                    reference::rmsnorm(&mut v, Some(&wc[j]), EPS);
                    for i in 0..n {
                        want2[t * out2_stride + i] = Some(v[i] as f64 * posts[j] as f64);
                    }
                }
                output_f32(name, vec![POISON; count * out2_stride], want2, tol::NORM)
            } else {
                // Unchained outputs must stay untouched.
                output_f32(name, vec![POISON; 4], vec![None; 4], tol::NORM)
            });
        }
        bufs.push(input_words("res", &res));
        // The chunk form's group sums of every output it writes, from the expected rows rounded
        // to f32 (each carries the rows' tol::NORM error, summed over ≤ 128 of them: the same
        // bound); the post check below holds each to f32 summation's bound over the values the
        // kernel wrote, in whatever order the subgroups add them.
        let gs = sums.unwrap_or(0);
        let outputs = 1 + n_chained;
        let groups = if gs > 0 { n / gs } else { 0 };
        let (sum_at, sums_len) = norm_sums_layout(count, groups, outputs);
        if gs > 0 {
            let mut want_s = vec![None; sums_len];
            for j in 0..outputs {
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
            bufs.push(output_f32("xsum", vec![POISON; sums_len], want_s, tol::NORM));
        } else {
            // The decode form has no binding 9: whatever is bound there stays untouched.
            bufs.push(output_f32("xsum", vec![POISON; 4], vec![None; 4], tol::NORM));
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
            sums: if gs > 0 { (1u32 << outputs) - 1 } else { 0 },
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
        if gs > 0 {
            l.post = Some(Box::new(move |out: &[Vec<u8>]| {
                let f = |b: &[u8]| -> Vec<f32> {
                    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
                };
                let xsum = f(&out[7]);
                for j in 0..outputs {
                    let (o, stride) = (f(&out[2 + j]), if j == 0 { out_stride } else { out2_stride });
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
                Ok(format!("xsum within f32 summation's bound of the written rows ({outputs} outputs)"))
            }));
        }
        l
    }
}

fn norm_cases() -> Vec<Box<dyn Case>> {
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
fn s_case(gs: usize, c: NormCase) -> NormCase {
    NormCase { sums: Some(gs), ..c }
}

/// The rows form over split-k partials writes bitwise what qmm_sum (the partials added into x)
/// and then the rows form over x write: the partials are added in qmm_sum's order.
#[test]
fn rmsnorm_rows_over_partials_is_bitwise_qmm_sum_then_the_norm() {
    let Some(mut h) = harness() else { return };
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
        let l = c.build(&mut Rng(kestrel::synth::SplitMix64(seed_of(&c.name()))));
        let init: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
        let parts = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
        // qmm_sum of the same partials into x, then the rows form over that x.
        let mp =
            MatmulParams { rows: c.n as u32, y_stride: c.n as u32, k_splits: c.splits as u32, ..Default::default() };
        let x = h
            .run(
                Kernel::QmmSum,
                &[init[8].clone(), init[0].clone()],
                bytemuck::bytes_of(&mp),
                l.step,
                ((c.n as u32).div_ceil(256), c.tokens as u32, 1),
            )
            .unwrap();
        let mut p: NormParams = *bytemuck::from_bytes(&l.params[..std::mem::size_of::<NormParams>()]);
        p.splits = 0;
        let mut over_x = init.clone();
        over_x[0] = x[1].clone();
        let plain =
            h.run(NormCase { splits: 0, ..c }.kernel(), &over_x, bytemuck::bytes_of(&p), l.step, l.grid).unwrap();
        let outputs = if c.chain.is_some() { 1 + c.chained } else { 1 };
        for j in 0..outputs {
            assert!(parts[2 + j] == plain[2 + j], "{}: output {j} differs from qmm_sum then the norm", c.name());
        }
        assert!(parts[7] == plain[7], "{}: the group sums differ", c.name());
    }
}

/// The rows form's sums form writes bitwise the outputs of its plain form (checked against the
/// CPU in `norm_cases`): the sums are added beside the rows, not into them; and the plain form
/// leaves xsum alone.
#[test]
fn rmsnorm_rows_sums_form_writes_the_plain_forms_outputs() {
    let Some(mut h) = harness() else { return };
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
        let l = c.build(&mut Rng(kestrel::synth::SplitMix64(seed_of(&c.name()))));
        let init: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
        let with_sums = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
        let plain = h.run(NormCase { sums: None, ..c }.kernel(), &init, &l.params, l.step, l.grid).unwrap();
        let outputs = if c.chain.is_some() { 1 + c.chained } else { 1 };
        for j in 0..outputs {
            assert!(with_sums[2 + j] == plain[2 + j], "{}: output {j} differs between the two forms", c.name());
        }
        assert!(plain[7] == init[7], "{}: the plain form wrote xsum", c.name());
        assert!(with_sums[7] != init[7], "{}: the sums form left xsum alone", c.name());
        println!("{} [wgpu]: {outputs} outputs bitwise equal to the plain form OK", c.name());
    }
}

// ---------------------------------------------------------------------------------------------
// head_norm_rope

#[derive(Clone, Copy)]
enum RopeKind {
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
struct HeadCase {
    d: usize,
    heads: usize,
    tokens: usize,
    pos0: usize,
    rope: RopeKind,
    weight: bool,
    slots: Option<usize>,
    src_pad: usize,
    /// Where the heads start in each src row (a later projection of stacked q | k | v).
    src_off: usize,
    /// Threads per head (`HeadNormRope { wg }`; d ≤ 4 · wg).
    wg: u32,
}

/// Offset of the norm weight in its buffer (the words before it are poison).
const HEAD_W_OFF: usize = 5;

impl HeadCase {
    fn new(d: usize, heads: usize, tokens: usize, pos0: usize, rope: RopeKind) -> Self {
        HeadCase { d, heads, tokens, pos0, rope, weight: true, slots: None, src_pad: 0, src_off: 0, wg: HEAD_NORM_WG }
    }
    /// Where this rope's cos/sin sit in a token's table row and the row length: as in the real
    /// program, sliding-layer ropes first and full-layer ropes after them (here the other layer
    /// kind's section is a stand-in of poison, so reading the wrong one fails).
    fn rope_layout(&self) -> (usize, usize) {
        match self.rope {
            RopeKind::Off => (0, self.d),
            RopeKind::Default { .. } => (0, 3 * self.d),
            RopeKind::Proportional { .. } => (self.d / 2, self.d / 2 + self.d),
        }
    }
}

impl Case for HeadCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &HeadCase { d, heads, tokens, pos0, rope, weight, slots, src_pad, src_off, wg } = self;
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
        let bufs = vec![
            input_words("src", &src),
            input_words("wt", &wt),
            input_words("rope", &table),
            output_f32("dst", vec![POISON; dst_rows * row], want, tol::NORM),
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
        launch(Kernel::HeadNormRope { wg }, bufs, &p, step, (heads, tokens))
    }
}

fn head_cases() -> Vec<Box<dyn Case>> {
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

// ---------------------------------------------------------------------------------------------
// attention

/// Token t (position pos0 + t) of every query head attends to positions [lo, pos0 + t] of its
/// kv head, read from ring caches of `slots` slots; window 0 = full attention.
#[derive(Clone, Copy)]
struct AttnCase {
    d: usize,
    heads: usize,
    kv_heads: usize,
    tokens: usize,
    pos0: usize,
    window: usize,
    slots: usize,
    /// q drawn from [-q_range, q_range) (1 by the rule): larger ranges give peaked softmaxes
    /// whose running maximum moves often, smaller ones near-uniform weights.
    q_range: f32,
    /// Run attention_coop.wgsl (tensor cores) instead of attention.wgsl.
    coop: bool,
    /// attention_coop's form that also writes its output's sums over each 64-dim value stage.
    sums: bool,
}

impl AttnCase {
    fn new(d: usize, heads: usize, kv_heads: usize, tokens: usize, pos0: usize, window: usize, slots: usize) -> Self {
        AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, q_range: 1.0, coop: false, sums: false }
    }

    /// The CPU's attention output for queries `q` ([token][head · d]) over the ring caches.
    fn reference(&self, q: &[f32], kc: &[f32], vc: &[f32]) -> Vec<Option<f64>> {
        let &AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, .. } = self;
        let lo = |p: usize| if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        let (qrow, kvrow, group) = (heads * d, kv_heads * d, heads / kv_heads);
        let mut want = vec![None; tokens * qrow];
        let mut o = vec![0.0f32; d];
        for t in 0..tokens {
            let p = pos0 + t;
            for h in 0..heads {
                let kvh = h / group;
                reference::attend(
                    &q[t * qrow + h * d..][..d],
                    lo(p)..p + 1,
                    |pos| &kc[(pos % slots) * kvrow + kvh * d..][..d],
                    |pos| &vc[(pos % slots) * kvrow + kvh * d..][..d],
                    &mut o,
                );
                for i in 0..d {
                    want[t * qrow + h * d + i] = Some(o[i] as f64);
                }
            }
        }
        want
    }
}

impl Case for AttnCase {
    fn name(&self) -> String {
        let c = self;
        let mut s = format!(
            "{}(d={},heads={},kv_heads={},tokens={},pos0={},window={},slots={}",
            if c.sums {
                "attention_coop_sums"
            } else if c.coop {
                "attention_coop"
            } else {
                "attention"
            },
            c.d,
            c.heads,
            c.kv_heads,
            c.tokens,
            c.pos0,
            c.window,
            c.slots
        );
        if c.q_range != 1.0 {
            s += &format!(",q_range={}", c.q_range);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng) -> Launch {
        let &AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, q_range, coop, sums } = self;
        let lo = |p: usize| if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        // Every position the step reads must have its own slot.
        assert!(pos0 + tokens - lo(pos0) <= slots, "{}: the ring is too small for this step", self.name());
        let (qrow, kvrow) = (heads * d, kv_heads * d);
        let q: Vec<f32> = rng.vec(tokens * qrow).into_iter().map(|v| v * q_range).collect();
        let kc = rng.vec(slots * kvrow);
        let vc = rng.vec(slots * kvrow);
        let want = self.reference(&q, &kc, &vc);
        // The tensor-core form's sums of each 64 values of o (one value stage): sums of 64
        // outputs within tol::ATTN, the same bound.
        let groups = qrow / 64;
        let want_s: Vec<Option<f64>> = (0..tokens * groups)
            .map(|i| Some((0..64).map(|j| want[i * 64 + j].expect("every output is compared")).sum()))
            .collect();
        let mut bufs = vec![
            input_words("q", &bits(&q)),
            input_words("k cache", &bits(&kc)),
            input_words("v cache", &bits(&vc)),
            output_f32("o", vec![POISON; tokens * qrow], want, tol::ATTN),
        ];
        if sums {
            bufs.push(output_f32("osum", vec![POISON; tokens * groups], want_s, tol::ATTN));
        }
        let p = AttnParams {
            d: d as u32,
            n_heads: heads as u32,
            n_kv_heads: kv_heads as u32,
            slots: slots as u32,
            window: window as u32,
            n_splits: 1,
            short_max: 0,
            _pad: 0,
        };
        let step = Step {
            n_tokens: tokens as u32,
            pos0: pos0 as u32,
            n_out: 1,
            out_row0: tokens as u32 - 1,
            ..Default::default()
        };
        let (kernel, bq) = if coop {
            assert!(attention_chunk_coop(d).is_some(), "{}: a head dim attention_coop does not take", self.name());
            (Kernel::AttentionCoop { d: d as u32, sums }, ATTN_COOP_BQ)
        } else {
            (attention_chunk(d), ATTN_BQ)
        };
        launch(kernel, bufs, &p, step, (heads, tokens.div_ceil(bq as usize)))
    }
}

/// Decode attention: attention_split (keys over ATTN_SPLITS workgroups per head) then
/// attention_combine, as the backend runs one-token and verify steps, against the same CPU
/// reference as `attention`: E2B's sliding and global heads, fewer keys than splits (empty
/// splits), a wrapped sliding ring with several tokens, splits of more than one 64-key tile, and
/// head dims that are not whole 64-lane rounds. Each case twice: q given, and q before its norm
/// and rope (the q-norm form: head_norm_rope's case of the same heads makes the strided raw q,
/// weights and rope table, and its CPU output is the reference's q).
#[test]
fn split_attention_matches_the_cpu_reference() {
    let Some(mut h) = harness() else { return };
    let a = AttnCase::new;
    let cases = [
        a(256, 8, 1, 1, 130, 512, 640),
        // 35 keys per split at head dim 256: several rounds of keys in flight and a partial one.
        a(256, 8, 1, 1, 1100, 0, 1101),
        a(512, 8, 1, 1, 600, 0, 602),
        a(32, 4, 1, 5, 0, 0, 16),
        a(32, 4, 1, 3, 200, 16, 18),
        a(64, 4, 2, 1, 2100, 0, 2101),
        a(64, 8, 2, 4, 70, 0, 80),
        // Head dims that leave lanes idle (40: one dim per lane on 40 lanes; 200: the fourth
        // dim on 8 lanes), more keys than one round of loads leaves in flight.
        a(40, 4, 1, 2, 90, 0, 100),
        a(200, 2, 1, 1, 70, 0, 80),
    ];
    for qnorm in [false, true] {
        for c in cases {
            let name = format!("{}{}", c.name(), if qnorm { " qnorm" } else { "" });
            let mut rng = Rng(kestrel::synth::SplitMix64(seed_of(&name)));
            let l = c.build(&mut rng);
            let Check::F32 { want, tol } = &l.bufs[3].check else { unreachable!("attention's o is an f32 output") };
            let splits = ATTN_SPLITS as usize;
            let mut p: AttnParams = *bytemuck::from_bytes(&l.params[..std::mem::size_of::<AttnParams>()]);
            p.n_splits = ATTN_SPLITS;
            let mut params = bytemuck::bytes_of(&p).to_vec();
            let part = vec![0u8; 4 * c.tokens * c.heads * splits * (c.d + 2)];
            let mut bufs = vec![l.bufs[0].bytes.clone(), l.bufs[1].bytes.clone(), l.bufs[2].bytes.clone(), part];
            let mut want = want.clone();
            if qnorm {
                // Sliding layers rotate every pair, full ones a quarter (Gemma 4's two ropes).
                let rope = if c.window > 0 {
                    RopeKind::Default { theta: 10_000.0 }
                } else {
                    RopeKind::Proportional { theta: 1_000_000.0, partial: 0.25 }
                };
                let hc = HeadCase { src_off: 3, src_pad: 5, ..HeadCase::new(c.d, c.heads, c.tokens, c.pos0, rope) };
                let hl = hc.build(&mut rng);
                let Check::F32 { want: q_want, .. } = &hl.bufs[3].check else {
                    unreachable!("head_norm_rope's dst is an f32 output")
                };
                let q: Vec<f32> = q_want.iter().map(|v| v.expect("dst_mode 0 writes every value") as f32).collect();
                let f = |b: &Buf| -> Vec<f32> { words(&b.bytes).into_iter().map(f32::from_bits).collect() };
                want = c.reference(&q, &f(&l.bufs[1]), &f(&l.bufs[2]));
                let hp: HeadParams = *bytemuck::from_bytes(&hl.params[..std::mem::size_of::<HeadParams>()]);
                let qp = QNormParams {
                    src_stride: hp.src_stride,
                    src_off: hp.src_off,
                    w_off: hp.w_off,
                    rope_off: hp.rope_off,
                    rope_stride: hp.rope_stride,
                    eps: hp.eps,
                    _pad: [0; 2],
                };
                bufs[0] = hl.bufs[0].bytes.clone();
                bufs.extend([hl.bufs[1].bytes.clone(), hl.bufs[2].bytes.clone()]);
                params.resize(PARAMS2_AT, 0);
                params.extend_from_slice(bytemuck::bytes_of(&qp));
            }
            // Which rows attention_short takes (AttnParams::short_max): none (split + combine
            // alone), every row, and, with several tokens, the rows up to the middle one's key
            // count (all three kernels writing one output, each row once: a verify step's
            // program). The keys of the row at position P: P + 1 − first_key(P).
            let keys = |t: usize| {
                let pos = c.pos0 + t;
                (pos + 1 - if c.window > 0 && pos + 1 > c.window { pos + 1 - c.window } else { 0 }) as u32
            };
            let mut owners = vec![("split", 0), ("short", u32::MAX)];
            if c.tokens > 1 {
                owners.push(("mixed", keys(c.tokens / 2)));
            }
            let limits = h.gpu().device_limits();
            for (form, short_max) in owners {
                let p = AttnParams { short_max, ..p };
                params[..std::mem::size_of::<AttnParams>()].copy_from_slice(bytemuck::bytes_of(&p));
                let short_rows = (0..c.tokens).filter(|&t| keys(t) <= short_max).count();
                let mut o = l.bufs[3].bytes.clone();
                if short_rows < c.tokens {
                    let out = h
                        .run(
                            attention_split(c.d, qnorm),
                            &bufs,
                            &params,
                            l.step,
                            (c.heads as u32, ATTN_SPLITS, c.tokens as u32),
                        )
                        .unwrap();
                    o = h
                        .run(
                            Kernel::AttentionCombine,
                            &[out[3].clone(), o],
                            bytemuck::bytes_of(&p),
                            l.step,
                            (c.heads as u32, c.tokens as u32, 1),
                        )
                        .unwrap()
                        .swap_remove(1);
                }
                // The short kernel at the two largest workgroup sizes (512 the default, 1024),
                // where the device's limits give them.
                let mut forms: Vec<(String, Option<Kernel>)> = Vec::new();
                for max_wg in [512, 1024] {
                    let k = attention_short_form(c.d, qnorm, max_wg, &limits);
                    // A device whose limits give both caps the same size runs it once.
                    if short_rows > 0 && !forms.iter().any(|f| f.1 == Some(k)) {
                        let Kernel::AttentionShort { wg, .. } = k else {
                            unreachable!("attention_short_form gives attention_short")
                        };
                        forms.push((format!(" wg{wg}"), Some(k)));
                    }
                }
                if forms.is_empty() {
                    forms.push((String::new(), None));
                }
                for (sum_form, kernel) in forms {
                    let mut o = o.clone();
                    if let Some(k) = kernel {
                        let mut sb = bufs.clone();
                        sb[3] = o;
                        o = h
                            .run(k, &sb, &params, l.step, (c.heads as u32, c.tokens as u32, 1))
                            .unwrap()
                            .swap_remove(3);
                    }
                    // POISON left in o (a row no kernel wrote, or one written twice and wrong) fails here.
                    let got: Vec<f32> = words(&o).into_iter().map(f32::from_bits).collect();
                    let (g, r): (Vec<f32>, Vec<f64>) =
                        want.iter().zip(&got).filter_map(|(w, &g)| w.map(|w| (g, w))).unzip();
                    match compare(&g, &r, *tol) {
                        Ok(nmse) => println!("split {name} {form}{sum_form} ({short_rows} of {} rows short) [wgpu]: o NMSE {nmse:.1e} OK", c.tokens),
                        Err(e) => panic!("split {name} {form}{sum_form}: {e}"),
                    }
                }
            }
        }
    }
}

fn attention_cases() -> Vec<Box<dyn Case>> {
    attention_shapes().into_iter().map(|c| Box::new(c) as Box<dyn Case>).collect()
}

fn attention_shapes() -> Vec<AttnCase> {
    let mut v: Vec<AttnCase> = Vec::new();
    let a = AttnCase::new;
    // Full attention: every head_dim × GQA group 1, 2, 4; 73 positions cross a 64-key tile.
    for d in [32, 64, 256, 512] {
        for (heads, kv) in [(4, 4), (4, 2), (8, 2)] {
            v.push(a(d, heads, kv, 3, 70, 0, 80));
        }
    }
    // The first chunk (causal inside the step), one key, token counts; E2B's 8:1 grouping.
    for tokens in [1, 9, 17] {
        v.push(a(64, 8, 1, tokens, 0, 0, 17));
        v.push(a(64, 8, 1, tokens, 59, 0, 80));
    }
    // A long full-attention context at E2B's global head_dim.
    v.push(a(512, 8, 1, 2, 600, 0, 602));
    // Sliding window 16 (the fixtures'): before the window fills, crossing it, and with the
    // ring wrapped many times (slots = window + tokens − 1, the fewest that work, and + 1).
    for tokens in [1, 9, 17] {
        for pos0 in [0, 10, 200] {
            v.push(a(32, 4, 1, tokens, pos0, 16, 16 + tokens - 1));
        }
        v.push(a(64, 4, 2, tokens, 75, 16, 16 + tokens));
    }
    // E2B's sliding layers: window 512, d 256, 8:1, crossing the window and wrapped.
    v.push(a(256, 8, 1, 3, 510, 512, 515));
    v.push(a(256, 8, 1, 3, 1000, 512, 515));
    // Chunks of several 16-query tiles (the last one partial): a first chunk (each tile's keys
    // end inside a 64-key tile), a later one crossing 64-key tiles at odd offsets, sliding
    // windows that start inside a query tile and a wrapped ring, E4B's global head dim.
    v.push(a(256, 8, 2, 40, 0, 0, 40));
    v.push(a(64, 4, 2, 33, 100, 0, 133));
    v.push(a(32, 4, 1, 40, 10, 16, 16 + 40 - 1));
    v.push(a(40, 2, 1, 50, 300, 20, 70));
    v.push(a(512, 4, 2, 20, 90, 0, 110));
    v
}

// ---------------------------------------------------------------------------------------------
// gelu_mul

/// `a[t, i] = gelu_tanh(a[t, i]) · b[t, b_off + i]`; defaults a_stride = b_stride = n, b_off 0.
#[derive(Clone, Copy)]
struct GeluCase {
    n: usize,
    tokens: usize,
    a_pad: usize,
    b_stride: usize,
    b_off: usize,
    /// a is uniform in [-range, range) (1 by the rule; 8 to reach tanh saturation).
    range: f32,
    /// b_in_a 1: the up values sit in a's own rows at b_off (stacked gate/up); b is unused.
    in_a: bool,
    /// The chunk form (`GeluMulSums`): also each token's sums of the output over groups of 64.
    sums: bool,
    /// > 1 (chunk form, plain rows of b): a is read as that many split-k partials' sum.
    splits: usize,
}

impl GeluCase {
    fn new(n: usize, tokens: usize) -> Self {
        GeluCase { n, tokens, a_pad: 0, b_stride: n, b_off: 0, range: 1.0, in_a: false, sums: false, splits: 0 }
    }
}

impl Case for GeluCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &GeluCase { n, tokens, a_pad, b_stride, b_off, range, in_a, sums, splits } = self;
        let a_stride = n + a_pad;
        let mut a = vec![POISON; tokens * a_stride];
        let mut b = vec![POISON; tokens * b_stride];
        let mut want = vec![None; tokens * a_stride];
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
                    // The up half is read, never written: it must keep its value.
                    a[t * a_stride + b_off + i] = y.to_bits();
                    want[t * a_stride + b_off + i] = Some(y as f64);
                } else {
                    b[t * b_stride + b_off + i] = y.to_bits();
                }
                want[t * a_stride + i] = Some(reference::gelu_tanh(x) as f64 * y as f64);
            }
        }
        // The sums of ≤ 64 outputs, each within tol::GELU: the same bound.
        let groups = n.div_ceil(64);
        let want_s: Vec<Option<f64>> = (0..tokens * groups)
            .map(|i| {
                Some(
                    (i % groups * 64..n.min(i % groups * 64 + 64))
                        .map(|j| want[i / groups * a_stride + j].expect("written"))
                        .sum(),
                )
            })
            .collect();
        let mut bufs = vec![output_f32("a", a, want, tol::GELU), input_words("b", &b)];
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
        launch(if sums { Kernel::GeluMulSums } else { Kernel::GeluMul }, bufs, &p, step, (n.div_ceil(64), tokens))
    }
}

fn gelu_cases() -> Vec<Box<dyn Case>> {
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

// ---------------------------------------------------------------------------------------------
// softcap_argmax

/// Per row: logits capped in place (cap > 0), best = the lowest index of the maximum. Every row
/// gets a planted maximum of 1.5 (above the [-1, 1) inputs, so the reference index is
/// unambiguous) at one index, or at several (`ties`: the lowest must win).
#[derive(Clone, Copy)]
struct ArgmaxCase {
    vocab: usize,
    rows: usize,
    cap: f32,
    ties: bool,
    /// About 1/8 of the logits are −∞ (masked).
    masked: bool,
}

impl Case for ArgmaxCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
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
        let mut capped = logits.clone();
        let tol = if cap > 0.0 {
            for row in capped.chunks_mut(vocab) {
                reference::softcap(row, cap);
            }
            tol::SOFTCAP
        } else {
            Tol::Exact // cap 0: the logits must come back as they were
        };
        let want = capped.iter().map(|&x| Some(x as f64)).collect();
        let chunks = argmax_chunks(vocab);
        let part_words = 2 * rows * chunks as usize;
        let mut part = vec![POISON; part_words];
        part.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
        let part = Buf { name: "part", bytes: to_bytes(&part), check: Check::Scratch { words: part_words } };
        let bufs =
            vec![output_f32("logits", bits(&logits), want, tol), part, output_u32("best", vec![POISON; rows], best)];
        let p = ArgmaxParams { vocab: vocab as u32, cap, chunks, _pad: 0 };
        // The LM head rows are the last n_out of the step.
        let step = Step { n_tokens: rows as u32 + 2, pos0: 0, n_out: rows as u32, out_row0: 2, ..Default::default() };
        let mut l = launch(Kernel::SoftcapArgmax, bufs, &p, step, (chunks as usize, rows));
        l.then = Some((Kernel::ArgmaxMerge, (rows as u32, 1, 1)));
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

fn argmax_cases() -> Vec<Box<dyn Case>> {
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
struct RouterCase {
    n_experts: usize,
    top_k: usize,
    tokens: usize,
    range: f32,
    ties: usize,
    /// per_expert_scale all 1 (else uniform in [0.5, 1.5)).
    unit_scale: bool,
    /// Expert 1's logit NaN in every token: it ranks last (never picked while k < n).
    nan: bool,
}

impl RouterCase {
    fn new(n_experts: usize, top_k: usize, tokens: usize) -> Self {
        RouterCase { n_experts, top_k, tokens, range: 1.0, ties: 0, unit_scale: false, nan: false }
    }
}

impl Case for RouterCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
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
        let (mut want_idx, mut want_w) = (Vec::new(), Vec::new());
        for t in 0..tokens {
            // A NaN logit counts as −∞: weight 0, sorted after every finite one.
            let s: Vec<f32> =
                logits[t * n..(t + 1) * n].iter().map(|&v| if v.is_nan() { f32::NEG_INFINITY } else { v }).collect();
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
        let bufs = vec![
            input_words("logits", &bits(&logits)),
            input_words("scale", &bits(&scale)),
            output_u32("idx", vec![POISON; tokens * k], want_idx),
            output_f32("weight", vec![POISON; tokens * k], want_w, tol::ROUTER),
        ];
        let p = RouterParams { n_experts: n as u32, top_k: k as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(Kernel::RouterTopk, bufs, &p, step, (tokens, 1))
    }
}

fn router_cases() -> Vec<Box<dyn Case>> {
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

// ---------------------------------------------------------------------------------------------
// moe_matmul

/// `y[t, j, r] = W[idx[t, j] · expert_stride + row_off + r] · x[t · x_tok_stride + j · x_slot_stride]`
/// over an expert stack of `experts · expert_stride` rows; y_stride = rows + y_pad.
#[derive(Clone, Copy)]
struct MoeMatmulCase {
    fmt: Format,
    experts: usize,
    top_k: usize,
    rows: usize,
    cols: usize,
    tokens: usize,
    gs: usize,
    /// Split gate/up/down: rows; HF's fused gate_up: 2·rows.
    expert_stride: usize,
    /// Fused gate_up: 0 (gate) or rows (up).
    row_off: usize,
    /// false: gate/up (x shared by the slots: x_slot_stride 0, x_tok_stride cols);
    /// true: down (each slot's own activation: x_slot_stride cols, x_tok_stride top_k·cols).
    per_slot: bool,
    y_pad: usize,
    /// The prefill form: moe_group's lists (computed here) drive moe_matmul_grouped.
    grouped: bool,
    /// The 4-bit decode form the backend runs (qmv_moe.wgsl) instead of moe_matmul.
    qmv: bool,
    /// With `grouped`: the 4-bit prefill form the backend runs (qmm_moe.wgsl).
    qmm: bool,
    /// With `qmm`: its tensor-core form (qmm_coop_moe.wgsl) with this tile (TB, RB) instead.
    coop: Option<(u32, u32)>,
    /// Every third pair SKIP (another round of a streamed step): its rows must stay untouched.
    skips: bool,
    /// With `qmv`: the float loop (`Tuning::qmv_digits` off) instead of the integer digits.
    floats: bool,
}

/// moe_group's output for `idx`: per group, the count then the ascending pair indices.
fn group_lists(idx: &[u32], n_groups: usize, stride: usize) -> Vec<u32> {
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
fn route(rng: &mut Rng, experts: usize, top_k: usize, tokens: usize) -> Vec<u32> {
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
    fn new(fmt: Format, experts: usize, top_k: usize, rows: usize, cols: usize, tokens: usize) -> Self {
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
    fn grouped(self) -> Self {
        MoeMatmulCase { grouped: true, ..self }
    }
    /// The up half of a fused gate_up.
    fn fused_up(self) -> Self {
        MoeMatmulCase { expert_stride: 2 * self.rows, row_off: self.rows, ..self }
    }
    fn x_strides(&self) -> (usize, usize) {
        if self.per_slot {
            (self.top_k * self.cols, self.cols)
        } else {
            (self.cols, 0)
        }
    }
}

impl Case for MoeMatmulCase {
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &MoeMatmulCase { fmt, experts, top_k, rows, cols, tokens, gs, expert_stride, row_off, y_pad, .. } = self;
        let w = Weights::new(fmt, experts * expert_stride, cols, gs, rng);
        let mut idx = route(rng, experts, top_k, tokens);
        if self.skips {
            idx.iter_mut().step_by(3).for_each(|e| *e = u32::MAX);
        }
        let (x_tok, x_slot) = self.x_strides();
        let x = rng.vec(tokens * x_tok);
        let y_stride = rows + y_pad;
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
                    w.matrix.row_f32(e * expert_stride + row_off + r, &mut row);
                    let s: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                    want[(t * top_k + j) * y_stride + r] = Some(s);
                }
            }
        }
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
            output_f32("y", vec![POISON; tokens * top_k * y_stride], want, tol::DOT),
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
        if let (true, true, Some((tb, rb))) = (self.grouped, self.qmm, self.coop) {
            // (n_groups · ceil(rows / BM), ceil(n_tokens / BN)), as the backend launches it.
            let p = MoeMatmulParams { n_groups: experts as u32, ..p };
            let x = experts * rows.div_ceil(32 * rb as usize);
            return launch(Kernel::QmmCoopMoe { tb, rb }, bufs, &p, step, (x, tokens.div_ceil(64 * tb as usize)));
        }
        if self.grouped && self.qmm {
            // (n_groups · ceil(rows / 64), ceil(n_tokens / 64)), as the backend launches it.
            let p = MoeMatmulParams { n_groups: experts as u32, ..p };
            let x = experts * rows.div_ceil(16 * QMM_MOE_TM as usize);
            return launch(Kernel::QmmMoe, bufs, &p, step, (x, tokens.div_ceil(QMM_TOK as usize)));
        }
        if self.grouped {
            // GridY::Fixed(n_groups): (ceil(rows / 4), experts, 1).
            return launch(
                Kernel::MoeMatmulGrouped(fmt),
                bufs,
                &p,
                step,
                (rows.div_ceil(MATMUL_ROWS as usize), experts),
            );
        }
        // GridY::Slots: (ceil(rows / rows per workgroup), top_k, n_tokens).
        let (kernel, per_wg) = if self.qmv {
            let tuning = Tuning { qmv_digits: !self.floats, ..Tuning::default() };
            qmv_moe_shape(rows, cols, top_k, x_tok, x_slot, &tuning).expect("qmv_moe applies to this case")
        } else {
            (Kernel::MoeMatmul(fmt), MATMUL_ROWS)
        };
        let mut l = launch(kernel, bufs, &p, step, (rows.div_ceil(per_wg as usize), top_k));
        l.grid.2 = tokens as u32;
        l
    }
}

fn moe_matmul_cases() -> Vec<Box<dyn Case>> {
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
fn qmm_moe_shapes(m: impl Fn(usize, usize, usize, usize, usize) -> MoeMatmulCase) -> Vec<Box<dyn Case>> {
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
struct GroupCase {
    groups: usize,
    top_k: usize,
    tokens: usize,
    /// Mark every third pair SKIP (another round of a streamed step).
    skips: bool,
}

impl Case for GroupCase {
    fn name(&self) -> String {
        format!("moe_group(groups={},top_k={},tokens={},skips={})", self.groups, self.top_k, self.tokens, self.skips)
    }

    fn build(&self, rng: &mut Rng) -> Launch {
        let &GroupCase { groups, top_k, tokens, skips } = self;
        let mut idx = route(rng, groups, top_k, tokens);
        if skips {
            idx.iter_mut().step_by(3).for_each(|e| *e = u32::MAX);
        }
        let stride = tokens + 2;
        let lists = group_lists(&idx, groups, stride);
        // Only the count and the listed pairs are specified; the rest of each list stays poison.
        let mut want = vec![None; groups * stride];
        for s in 0..groups {
            let n = lists[s * stride] as usize;
            for i in 0..=n {
                want[s * stride + i] = Some(lists[s * stride + i]);
            }
        }
        let bufs = vec![input_words("idx", &idx), output_u32("groups", vec![POISON; groups * stride], want)];
        let p = GroupParams { top_k: top_k as u32, stride: stride as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(Kernel::MoeGroup, bufs, &p, step, (groups, 1))
    }
}

fn group_cases() -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    // Pair counts below, at and across the 64-wide scan blocks (1·1 … 128·8).
    for (groups, top_k, tokens) in [(1, 1, 1), (4, 2, 3), (16, 4, 16), (16, 4, 17), (128, 8, 128), (7, 1, 200)] {
        for skips in [false, true] {
            v.push(Box::new(GroupCase { groups, top_k, tokens, skips }));
        }
    }
    v
}

/// The prefill expert kernel computes each pair exactly as the per-pair moe_matmul does (same
/// chunking, same sums, same tree): their outputs must be bitwise equal. (4-bit experts decode
/// through qmv_moe instead, whose arithmetic differs: there, as for dense 4-bit matrices, a
/// chunk's logits agree with token-by-token decoding within tolerance, not bitwise.)
#[test]
fn grouped_expert_kernel_is_bitwise_the_decode_kernel() {
    let Some(mut h) = harness() else { return };
    for fmt in [Format::Q4, Format::Q8, Format::Bf16, Format::F32] {
        for c in [
            MoeMatmulCase::new(fmt, 16, 4, 65, 320, 19).fused_up(),
            MoeMatmulCase { per_slot: true, ..MoeMatmulCase::new(fmt, 9, 8, 9, 704, 11) },
        ] {
            let outs: Vec<Vec<u8>> = [c, c.grouped()]
                .iter()
                .map(|case| {
                    let l = case.build(&mut Rng(kestrel::synth::SplitMix64(7)));
                    let bufs: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
                    let out = h.run(l.kernel, &bufs, &l.params, l.step, l.grid).unwrap();
                    out.last().unwrap().clone()
                })
                .collect();
            assert!(outs[0] == outs[1], "{}: grouped output differs from the per-pair kernel", c.name());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// moe_combine

/// `out[t, r] = Σ_j weight[t, j] · src[t, j, r]` over the token's top_k slots.
#[derive(Clone, Copy)]
struct CombineCase {
    n: usize,
    top_k: usize,
    tokens: usize,
}

impl Case for CombineCase {
    fn name(&self) -> String {
        format!("moe_combine(n={},top_k={},tokens={})", self.n, self.top_k, self.tokens)
    }

    fn build(&self, rng: &mut Rng) -> Launch {
        let &CombineCase { n, top_k, tokens } = self;
        let wt = rng.vec(tokens * top_k);
        let src = rng.vec(tokens * top_k * n);
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
        let bufs = vec![
            input_words("weight", &bits(&wt)),
            input_words("src", &bits(&src)),
            output_f32("out", vec![POISON; tokens * n], want, tol::DOT),
        ];
        let p = CombineParams { n: n as u32, top_k: top_k as u32, _pad: [0; 2] };
        let step =
            Step { n_tokens: tokens as u32, pos0: 0, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        launch(Kernel::MoeCombine, bufs, &p, step, (n.div_ceil(64), tokens))
    }
}

fn combine_cases() -> Vec<Box<dyn Case>> {
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

// ---------------------------------------------------------------------------------------------
// The runner

fn all_cases() -> Vec<Box<dyn Case>> {
    let mut v = matmul_cases();
    v.extend(embed_cases());
    v.extend(norm_cases());
    v.extend(head_cases());
    v.extend(attention_cases());
    v.extend(gelu_cases());
    v.extend(argmax_cases());
    v.extend(router_cases());
    v.extend(moe_matmul_cases());
    v.extend(group_cases());
    v.extend(combine_cases());
    v.extend(norm_qmv_cases());
    v.extend(group_sum_cases());
    v
}

/// group_sum.wgsl: the sums of each quantisation group of x's rows, which the tensor-core
/// mat-mats read (their cases pass sums from [`group_sums`]; this checks the pass itself).
#[derive(Clone, Copy)]
struct GroupSumCase {
    tokens: usize,
    cols: usize,
    gs: usize,
    /// Values past `cols` in each x row (poison: never summed).
    pad: usize,
    /// x rows per token.
    mult: usize,
    /// count_sel = 1 with this many rows.
    n_out: Option<usize>,
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

    fn build(&self, rng: &mut Rng) -> Launch {
        let &GroupSumCase { tokens, cols, gs, pad, mult, n_out } = self;
        let (count, stride, groups) = (n_out.unwrap_or(tokens), cols + pad, cols / gs);
        let vals = rng.vec(count * mult * cols);
        // Rows past count · mult and each row's padding are poison.
        let mut x = vec![POISON; tokens * mult * stride];
        for r in 0..count * mult {
            x[r * stride..r * stride + cols].copy_from_slice(&bits(&vals[r * cols..(r + 1) * cols]));
        }
        let mut want: Vec<Option<f64>> =
            group_sums_f64(&vals, count * mult, cols, cols, gs).into_iter().map(Some).collect();
        want.resize(tokens * mult * groups, None);
        // f32 sums of gs ≤ 128 terms in order (tol::DOT's argument).
        let bufs = vec![input_words("x", &x), output_f32("xsum", vec![POISON; tokens * mult * groups], want, tol::DOT)];
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

fn group_sum_cases() -> Vec<Box<dyn Case>> {
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

/// The case's seed: from its name (so a filtered re-run gets the same inputs), or KESTREL_SEED.
fn seed_of(name: &str) -> u64 {
    if let Some(s) = std::env::var("KESTREL_SEED").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    h % 1_000_000
}

fn gpu_required() -> bool {
    std::env::var("KESTREL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The tuning the kernels compile with: the defaults, or `KESTREL_TUNING` (CI runs these tests
/// again with `shader_checks=on`, naga's runtime checks, so an out-of-range index shows as a
/// difference between the two runs).
fn tuning() -> Tuning {
    let mut t = Tuning::default();
    if let Ok(list) = std::env::var("KESTREL_TUNING") {
        t.apply(&list).unwrap_or_else(|e| panic!("KESTREL_TUNING: {e}"));
    }
    t
}

/// The harness, or None (printed as skipped) where there is no adapter and none is required.
fn harness() -> Option<KernelHarness> {
    match KernelHarness::new(&tuning()) {
        Ok(h) => Some(h),
        Err(e) if e.to_string().contains("no GPU adapter") && !gpu_required() => {
            println!("skipped: no adapter ({e})");
            eprintln!("skipped: no adapter ({e})");
            None
        }
        Err(e) => panic!("kernel harness: {e}"),
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    worst: f64,
}

#[test]
fn every_kernel_matches_the_cpu_reference() {
    let Some(mut h) = harness() else { return };
    println!("device: {}", h.gpu().describe());
    let filter = std::env::var("KESTREL_KERNELS").unwrap_or_default();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    let start = std::time::Instant::now();
    for case in all_cases() {
        let name = case.name();
        if !name.contains(&filter) {
            continue;
        }
        let seed = seed_of(&name);
        let l = case.build(&mut Rng(kestrel::synth::SplitMix64(seed)));
        let t = tally.entry(l.kernel.label()).or_default();
        let line = match run_case(&mut h, &l) {
            Ok((report, worst)) => {
                t.passed += 1;
                t.worst = t.worst.max(worst);
                format!("{name} seed={seed} [wgpu]: {report} OK")
            }
            Err(e) => {
                t.failed += 1;
                let line = format!("{name} seed={seed} [wgpu]: FAIL {e}");
                failures.push(line.clone());
                line
            }
        };
        println!("{line}");
    }
    println!(
        "\n{:<16} {:>6} {:>6}  worst NMSE   ({:.1} s)",
        "kernel",
        "passed",
        "failed",
        start.elapsed().as_secs_f64()
    );
    for (k, t) in &tally {
        println!("{k:<16} {:>6} {:>6}  {:.1e}", t.passed, t.failed, t.worst);
    }
    assert!(!tally.is_empty(), "KESTREL_KERNELS={filter:?} matches no case");
    assert!(failures.is_empty(), "{} kernel case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// grid_barrier (a benchmark kernel: the cost of one grid-wide barrier, for the persistent-kernel
/// question) counts its arrivals and sees its own writes across its barriers; each dispatch
/// finds its base in a counter earlier dispatches left. One workgroup only: lavapipe runs one
/// workgroup per worker thread, and a grid wider than what runs at once would spin forever.
#[test]
fn grid_barrier_counts_and_sees_its_writes() {
    let Some(mut h) = harness() else { return };
    let to_bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let rounds = 40u32;
    let p = BarrierParams { rounds, _pad: [0; 3] };
    // A fresh counter, then one that two earlier dispatches of this grid left; the slots as
    // plain values and as atomics.
    for (start, atomic) in [0u32, 2 * rounds].into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let out = h
            .run(
                Kernel::GridBarrier { atomic },
                &[to_bytes(&[start]), to_bytes(&[0]), to_bytes(&[0])],
                bytemuck::bytes_of(&p),
                Step::default(),
                (1, 1, 1),
            )
            .unwrap();
        assert_eq!(
            words(&out[0]),
            vec![start + rounds],
            "counter after a dispatch from {start} (atomic slots: {atomic})"
        );
        assert_eq!(words(&out[1]), vec![rounds], "the workgroup's last round (atomic slots: {atomic})");
        assert_eq!(
            words(&out[2]),
            vec![0],
            "reads that saw a slot from before the last barrier (atomic slots: {atomic})"
        );
    }
}

/// last_workgroup (a probe kernel: a producer's workgroups hand their shares of an output to the
/// workgroup that arrives last) counts arrivals, elects one last workgroup per dispatch (the
/// generation advances by exactly one each), and that workgroup reads every share of its own
/// generation; the shares as plain values and as atomics, over 10 dispatches of one pass.
#[test]
fn last_workgroup_sees_every_share() {
    let Some(mut h) = harness() else { return };
    let to_bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let pattern = |g: u32, i: u32| g.wrapping_mul(2654435761).wrapping_add(i);
    let (start, reps) = (7u32, 10u32);
    for atomic in [false, true] {
        for (nwg, per) in [(5u32, 4u32), (3, 256), (40, 2), (6, 0)] {
            let p = BarrierParams { rounds: per, _pad: [0; 3] };
            let data = vec![u32::MAX; (nwg * per).max(1) as usize];
            let bufs = [to_bytes(&[0, start]), to_bytes(&data), to_bytes(&[0])];
            let out = h
                .run_n(
                    Kernel::LastWorkgroup { atomic },
                    &bufs,
                    bytemuck::bytes_of(&p),
                    Step::default(),
                    (nwg, 1, 1),
                    reps,
                )
                .unwrap();
            let what = format!("{nwg} workgroups × {per} values (atomic: {atomic})");
            assert_eq!(
                words(&out[0]),
                vec![0, start + reps],
                "arrivals reset, generation advanced once per dispatch: {what}"
            );
            assert_eq!(words(&out[2]), vec![0], "shares the last workgroup read from another generation: {what}");
            if per > 0 {
                let want: Vec<u32> = (0..nwg * per).map(|i| pattern(start + reps - 1, i)).collect();
                assert_eq!(words(&out[1]), want, "the last dispatch's shares: {what}");
            }
        }
    }
}

/// moe_norm (decode and verify steps close a MoE block in one dispatch) writes what the three
/// dispatches chunks still run write — rmsnorm mode 0 of the dense row, moe_combine, and
/// rmsnorm mode 1 of the experts' sum onto it — and matches an f64 reference (tolerance: two
/// norms over K-term sums, tol::NORM): the 26B's row (2816 values, top 8) for one and three
/// tokens, a row shorter than the workgroup with top 2, and E2B's width with top 4.
/// Against the three dispatches: the same operations in the same order, bitwise on lavapipe;
/// on the H200 not bitwise (the driver may contract a multiply and the add after it into one
/// FMA in one kernel and not in the other, as SPIR-V allows; session 22 measured NMSE ≤ 4.6e-15
/// there), so within tol::SAME_OPS.
#[test]
fn moe_norm_matches_its_three_dispatches() {
    let Some(mut h) = harness() else { return };
    let max_wg = h.gpu().limits.max_compute_invocations_per_workgroup;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let small = || vec![0u8; 16];
    for (n, k, tokens) in [(2816usize, 8usize, 1usize), (2816, 8, 3), (100, 2, 2), (1536, 4, 1)] {
        let what = format!("n {n}, top {k}, {tokens} token(s)");
        let mut rng = Rng(kestrel::synth::SplitMix64(seed_of(&format!("moe_norm {what}"))));
        let (dense, eo, wts, wt) = (rng.vec(tokens * n), rng.vec(tokens * k * n), rng.vec(tokens * k), rng.vec(3 * n));
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
                    "moe_norm {what}: NMSE {nmse:.1e} against the three dispatches, {same} of {} values bitwise",
                    tokens * n
                );
            }
            Err(e) => panic!("{what}: moe_norm against the three dispatches: {e}"),
        }
        // The reference, in f64.
        let mut reference = vec![0f64; tokens * n];
        let rms = |v: &[f64]| 1.0 / (v.iter().map(|x| x * x).sum::<f64>() / n as f64 + eps as f64).sqrt();
        for t in 0..tokens {
            let d: Vec<f64> = dense[t * n..(t + 1) * n].iter().map(|&x| x as f64).collect();
            let m: Vec<f64> =
                (0..n).map(|i| (0..k).map(|j| wts[t * k + j] as f64 * eo[(t * k + j) * n + i] as f64).sum()).collect();
            let (r1, r2) = (rms(&d), rms(&m));
            for i in 0..n {
                reference[t * n + i] = d[i] * r1 * wt[n + i] as f64 + m[i] * r2 * wt[2 * n + i] as f64;
            }
        }
        let got: Vec<f32> = words(&got).into_iter().map(f32::from_bits).collect();
        if let Err(e) = compare(&got, &reference, tol::NORM) {
            panic!("{what}: moe_norm against the f64 reference: {e}");
        }
    }
}

#[test]
fn harness_rejects_a_wrong_number_of_buffers() {
    let Some(mut h) = harness() else { return };
    let e = h.run(Kernel::GeluMul, &[vec![0; 4]], &[0; 16], Step::default(), (1, 1, 1)).unwrap_err();
    assert!(e.to_string().contains("gelu_mul takes 2 storage buffers, got 1"), "{e}");
}

/// qkv_norm_rope (one dispatch for the q, k and v heads of a stacked q | k | v row) writes
/// bitwise what three head_norm_rope dispatches write (those are checked against the CPU
/// reference in `head_cases`): E2B's sliding (8 q heads, 1 kv head, d 256) and full (d 512)
/// layers, a GQA layer with K-as-V (v_off = k_off), several tokens wrapping the ring.
#[test]
fn qkv_norm_rope_is_bitwise_three_head_norm_ropes() {
    let Some(mut h) = harness() else { return };
    let to_bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    // (d, n_q, n_kv, k_eq_v, tokens, pos0, slots)
    for (d, n_q, n_kv, k_eq_v, tokens, pos0, slots) in
        [(256, 8, 1, false, 1, 130, 640), (512, 8, 1, false, 1, 600, 602), (64, 6, 2, true, 3, 7, 8)]
    {
        let mut rng = Rng(kestrel::synth::SplitMix64(d as u64 * 31 + n_kv as u64));
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
                        h: &mut KernelHarness| {
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
            let want_q = head(n_q, 0, q_w as u32, 1, 0, tokens * q_dim, &mut h);
            let want_k = head(n_kv, k_off, k_w as u32, 1, 1, slots * kv_dim, &mut h);
            let want_v = head(n_kv, v_off, NO_WEIGHT, 0, 1, slots * kv_dim, &mut h);
            let case = format!("qkv_norm_rope(d={d},n_q={n_q},n_kv={n_kv},k_eq_v={k_eq_v},tokens={tokens},pos0={pos0},slots={slots},wg={wg})");
            assert!(fused[3] == want_q, "{case}: q differs from head_norm_rope");
            assert!(fused[4] == want_k, "{case}: k differs from head_norm_rope");
            assert!(fused[5] == want_v, "{case}: v differs from head_norm_rope");
            assert!(want_k.iter().any(|&b| b != 0) && want_v.iter().any(|&b| b != 0), "{case}: nothing written");
            println!("{case} [wgpu]: q, k, v bitwise equal to head_norm_rope OK");
        }
    }
}

/// qmv_moe_glu (fused gate_up experts, GeGLU epilogue) against the CPU reference
/// `gelu_tanh(G_e x) · (U_e x)`: the 26B expert width (704 rows × 2816 cols, 8 of 128 slots),
/// a partial team block (rows 70), several tokens with a SKIP pair left untouched.
#[test]
fn moe_glu_matches_the_cpu_reference() {
    let Some(mut h) = harness() else { return };
    let to_bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    // (experts, top_k, rows, cols, tokens)
    // The digit loop, then the float loop (qmv_digits off).
    let shapes = [
        (16, 8, 704, 2816, 1, true),
        (5, 3, 70, 256, 3, true),
        (16, 8, 704, 2816, 1, false),
        (5, 3, 70, 256, 3, false),
    ];
    for (experts, top_k, rows, cols, tokens, digits) in shapes {
        let mut rng = Rng(kestrel::synth::SplitMix64((rows * 7 + cols) as u64));
        let stride = 2 * rows;
        let w = Weights::new(Format::Q4, experts * stride, cols, 64, &mut rng);
        let xs = rng.vec(tokens * cols);
        let mut idx: Vec<u32> = (0..tokens * top_k).map(|i| ((i * 7 + 3) % experts) as u32).collect();
        if tokens > 1 {
            idx[1] = u32::MAX; // SKIP: a pair of another streaming round
        }
        let y_ref = reference::matmul(&w.matrix, &xs, tokens); // [t, experts · stride]
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
            Ok(nmse) => println!("{case} [wgpu]: y NMSE {nmse:.1e} OK"),
            Err(e) => panic!("{case}: {e}"),
        }
    }
}

/// gelu_mul's chunk form over a split-k gate's partials (`splits` > 1) writes bitwise what
/// qmm_sum followed by the same form over the summed gate writes (each checked against the CPU
/// in `gelu_cases`): the PLE gate's 256 rows in 8 splits, and 3 splits of a partial group.
#[test]
fn gelu_mul_over_split_partials_is_bitwise_qmm_sum_then_gelu_mul() {
    let Some(mut h) = harness() else { return };
    for c in [
        GeluCase { b_stride: 42 * 256, b_off: 5 * 256, sums: true, splits: 8, ..GeluCase::new(256, 9) },
        GeluCase { sums: true, splits: 3, ..GeluCase::new(65, 4) },
    ] {
        let l = c.build(&mut Rng(kestrel::synth::SplitMix64(seed_of(&c.name()))));
        let mut init: Vec<Vec<u8>> = l.bufs.iter().map(|b| b.bytes.clone()).collect();
        let fused = h.run(l.kernel, &init, &l.params, l.step, l.grid).unwrap();
        // qmm_sum writes the gate (storage buffer 0, a) from the partials (3), then gelu_mul.
        let mp =
            MatmulParams { rows: c.n as u32, y_stride: c.n as u32, k_splits: c.splits as u32, ..Default::default() };
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
        let mut p: GeluParams = *bytemuck::from_bytes(&l.params[..std::mem::size_of::<GeluParams>()]);
        p.splits = 0;
        let apart = h.run(Kernel::GeluMulSums, &init, bytemuck::bytes_of(&p), l.step, l.grid).unwrap();
        assert!(fused[0] == apart[0], "{}: a differs from qmm_sum then gelu_mul", c.name());
        assert!(fused[2] == apart[2], "{}: asum differs from qmm_sum then gelu_mul", c.name());
        println!("{} [wgpu]: a and asum bitwise qmm_sum then gelu_mul OK", c.name());
    }
}

/// persistent_chain (a probe kernel: a chain of 4-bit mat-vecs as one dispatch per stage or one
/// persistent dispatch with grid barriers) computes each stage of its chain against an f64
/// reference (tol::DOT: f32 sums of ≤ 1024 products per row, the error of the stage before
/// carried at its size), and every form writes the same bits: one dispatch per stage with one
/// workgroup per row block or two striding over them, and the persistent dispatch with the
/// next stage's first weights loaded before each barrier, inside it or after it. One workgroup
/// in the persistent form: lavapipe runs one workgroup per worker thread (grid_barrier's test says
/// why); the bench runs 132 on the H200.
#[test]
fn persistent_chain_forms_match_the_reference_and_each_other() {
    let Some(mut h) = harness() else { return };
    let shapes = [(1024u32, 512u32), (512, 1024), (48, 512)];
    let layout = chain_layout(&shapes).unwrap();
    let mut rng = Rng(kestrel::synth::SplitMix64(seed_of("persistent_chain")));
    let w: Vec<u32> = (0..4 * layout.w_vec4s).map(|_| rng.next_u64() as u32).collect();
    // Scales 2^-6 … 2^-5 and biases within −8 scales: values of either sign, as MLX's.
    let sb: Vec<u32> = (0..layout.sb_words)
        .map(|_| {
            let s = bf16::from_f32((1.0 + rng.uniform().abs()) / 64.0);
            let b = bf16::from_f32(-8.0 * s.to_f32() * rng.uniform().abs());
            u32::from(s.to_bits()) | u32::from(b.to_bits()) << 16
        })
        .collect();
    let x0 = rng.vec(shapes[0].1 as usize);
    let mut act = vec![POISON; layout.act_values];
    act[..x0.len()].copy_from_slice(&bits(&x0));
    // The f64 reference chain.
    let mut want: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
    let mut wants = Vec::new();
    for st in &layout.stages {
        let (rows, cols) = (st.rows as usize, st.cols as usize);
        let y: Vec<f64> = (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|k| {
                        let word = w[4 * st.w as usize + r * cols / 8 + k / 8];
                        let q = (word >> (4 * (k % 8))) & 15;
                        let g = sb[st.sb as usize + r * cols / 64 + k / 64];
                        let (s, b) = (bf16::from_bits(g as u16).to_f64(), bf16::from_bits((g >> 16) as u16).to_f64());
                        (s * q as f64 + b) * want[k]
                    })
                    .sum()
            })
            .collect();
        wants.push(y.clone());
        want = y;
    }
    let bufs = [to_bytes(&w), to_bytes(&sb), to_bytes(&act), to_bytes(&[0])];
    let params = |first: u32, count: u32, prefetch: ChainPrefetch| {
        bytemuck::bytes_of(&chain_params(&layout, first, count, prefetch)).to_vec()
    };
    let per_stage = |grid: Option<u32>| -> Vec<(Vec<u8>, (u32, u32, u32))> {
        layout
            .stages
            .iter()
            .enumerate()
            .map(|(i, st)| (params(i as u32, 1, ChainPrefetch::After), (grid.unwrap_or(st.rows / 16), 1, 1)))
            .collect()
    };
    let n = layout.stages.len() as u32;
    let forms = [
        ("one dispatch per stage", per_stage(None)),
        ("one dispatch per stage, 2 workgroups", per_stage(Some(2))),
        ("persistent, loads before each barrier", vec![(params(0, n, ChainPrefetch::Before), (1, 1, 1))]),
        ("persistent, loads inside each barrier", vec![(params(0, n, ChainPrefetch::Inside), (1, 1, 1))]),
        ("persistent, loads after each barrier", vec![(params(0, n, ChainPrefetch::After), (1, 1, 1))]),
    ];
    let mut first_out: Option<Vec<u8>> = None;
    // Batches of 4 vec4s (lanes of 2 vec4s per row in the 1024-wide stage: a partial batch)
    // and of 1.
    for (pf, (what, links)) in [4u32, 1].into_iter().flat_map(|pf| forms.iter().map(move |f| (pf, f))) {
        let kernel = Kernel::PersistentChain { xcap: 1024, pf, wg: 256 };
        let what = format!("{what}, batches of {pf}");
        // Fresh buffers per form: the counter from 0, the outputs poisoned.
        let up = h.upload_chain(kernel, &bufs).unwrap();
        let out = h.run_chain(&up, links, Step::default()).unwrap();
        let got: Vec<f32> = words(&out[2]).into_iter().map(f32::from_bits).collect();
        assert_eq!(got[..x0.len()], x0[..], "{what}: the input changed");
        for (i, (st, y)) in layout.stages.iter().zip(&wants).enumerate() {
            let at = st.y as usize;
            if let Err(e) = compare(&got[at..at + y.len()], y, tol::DOT) {
                panic!("{what}: stage {i} ({} × {}): {e}", st.rows, st.cols);
            }
        }
        let barriers = if links.len() == 1 { n - 1 } else { 0 };
        assert_eq!(words(&out[3]), vec![barriers], "{what}: barrier arrivals");
        match &first_out {
            None => first_out = Some(out[2].clone()),
            Some(f) => assert!(f == &out[2], "{what}: not bitwise the first form's activations"),
        }
    }
}

/// stream_read (a benchmark kernel: the read bandwidth of one dispatch) stores nothing while
/// the OR of a thread's values misses `never`, and stores that OR where it reaches it — so the
/// benchmark's loads cannot be dropped and its zero data write nothing. 4 vec4s per thread
/// over 3000 (the last thread's indices clamped to the end).
#[test]
fn stream_read_stores_only_on_its_never_pattern() {
    let Some(mut h) = harness() else { return };
    let (n, vpt) = (3000u32, 4u32);
    let grid = (n.div_ceil(256 * vpt), 1, 1);
    let threads = 256 * grid.0;
    let dst = vec![0u8; 16 * threads as usize];
    let out = h
        .run(
            Kernel::StreamRead { vpt },
            &[vec![0u8; 16 * n as usize], dst.clone()],
            bytemuck::bytes_of(&CopyParams { n, _pad: [1, 0, 0] }),
            Step::default(),
            grid,
        )
        .unwrap();
    assert!(out[1].iter().all(|&b| b == 0), "zero data, never = 1: nothing stored");
    // Value i's bits in lane 0 of vec4 i: thread t's OR is that of i = t + k · threads, k < 4
    // (clamped to n − 1); `never` set to thread 5's OR: thread 5 (and any other reaching it)
    // stores its OR.
    let data: Vec<u32> = (0..n).flat_map(|i| [i, 0, 0, 0]).collect();
    let or_of = |t: u32| (0..vpt).fold(0u32, |a, k| a | (t + k * threads).min(n - 1));
    let never = or_of(5);
    let out = h
        .run(
            Kernel::StreamRead { vpt },
            &[to_bytes(&data), dst],
            bytemuck::bytes_of(&CopyParams { n, _pad: [never, 0, 0] }),
            Step::default(),
            grid,
        )
        .unwrap();
    let got = words(&out[1]);
    for t in 0..threads {
        let want = if or_of(t) == never { [or_of(t), 0, 0, 0] } else { [0; 4] };
        assert_eq!(got[4 * t as usize..4 * t as usize + 4], want, "thread {t}");
    }
}
