//! The kernel case table, shared by the kernel tests (`tests/kernels.rs`: every case on every
//! backend's [`KernelRunner`], against the CPU reference) and the single-kernel benchmarks
//! (`benches/kernels.rs`: the same cases at Gemma 4's sizes, built with their inputs only, and
//! timed). One file per kernel family, each with its case structs, its `*_cases()` table and
//! the tests that compare forms of its kernels with each other:
//!
//! | file | kernels |
//! |---|---|
//! | `matmul.rs` | `matmul` (every format); the 4-bit mat-vec `qmv` and its GeGLU, gated and fused-norm forms |
//! | `qmm.rs` | the 4-bit prefill mat-mat `qmm`, split k with `qmm_sum`, its tensor-core `qmm_coop`; `group_sum` |
//! | `norms.rs` | `rmsnorm`, `rmsnorm_rows`, `head_norm_rope`, `qkv_norm_rope` |
//! | `attention.rs` | chunk attention (and `attention_coop`), decode attention: `attention_split` + `attention_combine`, `attention_short` |
//! | `moe.rs` | `moe_matmul`, `qmv_moe`, `qmm_moe` (and on tensor cores), `moe_group`, `moe_combine`, `moe_norm`, `qmv_moe_glu` |
//! | `small.rs` | `embed`, `gelu_mul`, `softcap_argmax` + `argmax_merge`, `router_topk` |
//! | `probes.rs` | the benchmark probes: `grid_barrier`, `last_workgroup`, `persistent_chain`, `stream_read` |
//!
//! This file: what a case is ([`Case`] builds a [`Launch`]: buffers with their [`Check`]s,
//! params, step, grid), the thresholds ([`tol`]), random inputs ([`Rng`], [`Weights`]), running
//! and checking a launch ([`run_case`]) and the table ([`all_cases`]).
//!
//! A case keeps its inputs apart from its reference: `build(rng, Want::Reference)` (the tests)
//! computes the expected outputs on the CPU, `build(rng, Want::InputsOnly)` (the benchmarks, at
//! sizes where the reference would take minutes) makes the same buffers, params and grid and
//! leaves every output unchecked. Each case computes its reference inside `want.then(|| …)`.

// Two crates include this module (the tests and the benchmarks), each using part of it; the
// `#[test]`s in its files exist only in the first.
#![allow(dead_code)]

pub mod attention;
pub mod matmul;
pub mod moe;
pub mod norms;
pub mod probes;
pub mod qmm;
pub mod small;

use half::bf16;
use kestrel::kernels::{Format, Kernel, KernelRunner, Step};
use kestrel::loader::{FileBytes, Matrix, SafetensorsFile, TensorStore};
use kestrel::quant;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

// ---------------------------------------------------------------------------------------------
// Thresholds

#[derive(Clone, Copy, Debug)]
pub enum Tol {
    /// Bit-identical to the reference (as f32).
    Exact,
    /// NMSE = Σ(a−b)²/Σb² at most this.
    Nmse(f64),
}

/// Every threshold with its argument. ε = 2^-24 (f32 unit roundoff); the reference is f64.
pub mod tol {
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
pub struct Rng(kestrel::synth::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(kestrel::synth::SplitMix64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1), a multiple of 2^-23 (an exact f32).
    pub fn uniform(&mut self) -> f32 {
        self.0.uniform()
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// `n` random bytes, 8 from each draw (fast enough for a 256 MiB matrix).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        for c in v.chunks_mut(8) {
            c.copy_from_slice(&self.next_u64().to_le_bytes()[..c.len()]);
        }
        v
    }
}

/// The case's seed: from its name (so a filtered re-run gets the same inputs), or KESTREL_SEED.
pub fn seed_of(name: &str) -> u64 {
    if let Some(s) = std::env::var("KESTREL_SEED").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    h % 1_000_000
}

/// What every output word starts as: a quiet NaN with a recognisable payload.
pub const POISON: u32 = 0x7fc0_dead;

/// What follows every output buffer (a NaN too, so a stray read poisons the result).
pub const GUARD: u32 = 0x7fa5_a5a5;

pub const GUARD_WORDS: usize = 64;

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// x's group sums as group_sum.wgsl leaves them for the tensor-core mat-mats: per row r of
/// `rows` (at r · stride in x), the sum of each `gs` values of its first `cols`, [rows, cols / gs]
/// (in f64; [`group_sums`] rounds them to f32 for the mat-mats' inputs).
pub fn group_sums_f64(x: &[f32], rows: usize, stride: usize, cols: usize, gs: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|r| (0..cols / gs).map(move |g| x[r * stride + g * gs..][..gs].iter().map(|&v| v as f64).sum()))
        .collect()
}

pub fn group_sums(x: &[f32], rows: usize, stride: usize, cols: usize, gs: usize) -> Vec<f32> {
    group_sums_f64(x, rows, stride, cols, gs).into_iter().map(|v| v as f32).collect()
}

pub fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

pub fn f32s(b: &[u8]) -> Vec<f32> {
    words(b).into_iter().map(f32::from_bits).collect()
}

pub fn to_bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

// ---------------------------------------------------------------------------------------------
// A case

/// What [`Case::build`] makes besides the inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The expected outputs too, from the CPU reference (the tests).
    Reference,
    /// The inputs alone, for a benchmark at a real model's size where the reference would take
    /// minutes: every output unchecked, and quantised weights drawn as random codes rather than
    /// quantised from floats ([`Weights::new`]).
    InputsOnly,
}

impl Want {
    /// `reference()` where the reference is wanted, else None: every case computes its expected
    /// outputs inside one of these.
    pub fn then<T>(self, reference: impl FnOnce() -> T) -> Option<T> {
        (self == Want::Reference).then(reference)
    }
}

/// A test case: `name()` prints every parameter (with the seed, a repro), `kernel()` is the
/// form the shape rules pick for those parameters, `build()` makes the launch.
pub trait Case {
    fn name(&self) -> String;
    fn kernel(&self) -> Kernel;
    fn build(&self, rng: &mut Rng, want: Want) -> Launch;
}

/// What a storage buffer must hold after the dispatch.
pub enum Check {
    /// Read-only: must come back bit-identical.
    Input,
    /// f32 output: `want[i] = Some(reference)` is compared; `None` words and the guard must be unchanged.
    F32 { want: Vec<Option<f64>>, tol: Tol },
    /// u32 output compared exactly, same rule for `None` and the guard.
    U32 { want: Vec<Option<u32>> },
    /// Scratch between the passes of a two-pass kernel: any value, only the guard is checked.
    Scratch { words: usize },
    /// An output built without its reference ([`Want::InputsOnly`]): a launch to time, not to check.
    Unchecked,
}

/// One storage binding: its name (for messages), initial bytes, and the check.
pub struct Buf {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub check: Check,
}

pub fn input(name: &'static str, bytes: Vec<u8>) -> Buf {
    Buf { name, bytes, check: Check::Input }
}

pub fn input_words(name: &'static str, w: &[u32]) -> Buf {
    input(name, to_bytes(w))
}

/// An f32 output starting as `init` (poison, or the in/out operand), with the guard appended;
/// `want` is None when built with [`Want::InputsOnly`].
pub fn output_f32(name: &'static str, init: Vec<u32>, want: Option<Vec<Option<f64>>>, tol: Tol) -> Buf {
    let check = match want {
        Some(want) => {
            assert_eq!(init.len(), want.len(), "{name}: init and want differ in length");
            Check::F32 { want, tol }
        }
        None => Check::Unchecked,
    };
    let mut w = init;
    w.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
    Buf { name, bytes: to_bytes(&w), check }
}

pub fn output_u32(name: &'static str, init: Vec<u32>, want: Option<Vec<Option<u32>>>) -> Buf {
    let check = match want {
        Some(want) => {
            assert_eq!(init.len(), want.len(), "{name}: init and want differ in length");
            Check::U32 { want }
        }
        None => Check::Unchecked,
    };
    let mut w = init;
    w.extend(std::iter::repeat_n(GUARD, GUARD_WORDS));
    Buf { name, bytes: to_bytes(&w), check }
}

/// An extra check on the read-back buffers (e.g. argmax consistent with the written logits).
pub type PostCheck = Box<dyn Fn(&[Vec<u8>]) -> Result<String, String>>;

/// One dispatch, ready to run: buffers in binding order, params, step, grid.
pub struct Launch {
    pub kernel: Kernel,
    pub bufs: Vec<Buf>,
    pub params: Vec<u8>,
    pub step: Step,
    pub grid: (u32, u32, u32),
    /// A second dispatch on the buffers the first left (a two-pass kernel), and its grid.
    pub then: Option<(Kernel, (u32, u32, u32))>,
    pub post: Option<PostCheck>,
}

pub fn launch<P: bytemuck::Pod>(kernel: Kernel, bufs: Vec<Buf>, p: &P, step: Step, grid: (usize, usize)) -> Launch {
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

impl Launch {
    /// The storage buffers' initial bytes, in binding order.
    pub fn buffers(&self) -> Vec<Vec<u8>> {
        self.bufs.iter().map(|b| b.bytes.clone()).collect()
    }

    /// The (first) params block as the struct it was made from.
    pub fn params_as<P: bytemuck::Pod>(&self) -> P {
        bytemuck::pod_read_unaligned(&self.params[..std::mem::size_of::<P>()])
    }

    /// Runs the first dispatch on `r` as it is (no second pass, no checks).
    pub fn run(&self, r: &mut dyn KernelRunner) -> kestrel::Result<Vec<Vec<u8>>> {
        r.run(self.kernel, &self.buffers(), &self.params, self.step, self.grid)
    }

    /// Folds grid x into x · z past `max` workgroups (as the backend does past the device's
    /// limit, for the kernels that linearise `wid.x + wid.z · num_workgroups.x`: matmul, qmv,
    /// embed).
    pub fn fold_x(&mut self, max: u32) {
        if self.grid.0 > max {
            assert_eq!(self.grid.2, 1, "{}: grid z is taken", self.kernel.label());
            let (x, z) = kestrel::kernels::fold_grid(self.grid.0, max);
            self.grid = (x, self.grid.1, z);
        }
    }

    /// The first dispatch with the buffers moved out: what a benchmark times.
    pub fn into_dispatch(self) -> Dispatch {
        Dispatch {
            kernel: self.kernel,
            buffers: self.bufs.into_iter().map(|b| b.bytes).collect(),
            params: self.params,
            step: self.step,
            grid: self.grid,
        }
    }
}

/// One dispatch as a runner takes it (a part of a multi-dispatch form: split k, split attention).
pub struct Dispatch {
    pub kernel: Kernel,
    pub buffers: Vec<Vec<u8>>,
    pub params: Vec<u8>,
    pub step: Step,
    pub grid: (u32, u32, u32),
}

impl Dispatch {
    pub fn run(&self, r: &mut dyn KernelRunner) -> kestrel::Result<Vec<Vec<u8>>> {
        r.run(self.kernel, &self.buffers, &self.params, self.step, self.grid)
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison

/// Compares `got` with the reference: non-finite values first, then NMSE (returned).
pub fn compare(got: &[f32], want: &[f64], tol: Tol) -> Result<f64, String> {
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
pub fn untouched(
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

/// Runs one launch on `r` and checks every buffer. Ok: the report and the largest NMSE.
pub fn run_case(r: &mut dyn KernelRunner, l: &Launch) -> Result<(String, f64), String> {
    let init = l.buffers();
    let mut out = r.run(l.kernel, &init, &l.params, l.step, l.grid).map_err(|e| format!("dispatch failed: {e}"))?;
    if let Some((kernel, grid)) = l.then {
        out = r.run(kernel, &out, &l.params, l.step, grid).map_err(|e| format!("second pass failed: {e}"))?;
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
            Check::Unchecked => return Err(format!("{}: built without its reference (Want::InputsOnly)", b.name)),
        }
    }
    if let Some(post) = &l.post {
        parts.push(post(&out)?);
    }
    Ok((parts.join(", "), worst))
}

/// Runs each case (seeded by its name) on `r`, printing a line per case; returns the failures'
/// lines.
pub fn run_all(r: &mut dyn KernelRunner, cases: impl Iterator<Item = Box<dyn Case>>) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let name = case.name();
        let seed = seed_of(&name);
        let l = case.build(&mut Rng::new(seed), Want::Reference);
        let backend = r.backend().to_string();
        match run_case(r, &l) {
            Ok((report, _)) => println!("{name} seed={seed} [{backend}]: {report} OK"),
            Err(e) => failures.push(format!("{name} seed={seed} [{backend}]: FAIL {e}")),
        }
    }
    failures
}

// ---------------------------------------------------------------------------------------------
// Weights as the loader sees them

/// A weight matrix in one format: the loader's `Matrix` (the reference reads it with `row_f32`)
/// and the bytes the GPU gets.
pub struct Weights {
    /// None when built for timing alone ([`Want::InputsOnly`]).
    matrix: Option<Matrix>,
    /// w, scales, biases (the last two empty for float formats).
    bytes: [Vec<u8>; 3],
    row_bytes: [usize; 3],
}

impl Weights {
    /// `rows` × `cols` weights uniform in [-1, 1), quantised (`quant::quantize`, so kernel and
    /// reference see the same weights) or rounded to the format. With [`Want::InputsOnly`]: the
    /// same bytes and layout drawn the cheapest way (a 256 MiB matrix in a fraction of a
    /// second), with no loader view: random codes, every group's scale 2/levels and bias −1
    /// (values in [−1, 1] as quantised uniforms), float formats rounded from uniforms.
    pub fn new(fmt: Format, rows: usize, cols: usize, gs: usize, rng: &mut Rng, want: Want) -> Weights {
        if want == Want::InputsOnly {
            return Weights::random(fmt, rows, cols, gs, rng);
        }
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
                Weights { matrix: Some(matrix), bytes: [wb, sb, bb], row_bytes: [cols * bits as usize / 8, g, g] }
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
                Weights { matrix: Some(matrix), bytes: [wb, Vec::new(), Vec::new()], row_bytes: [esize * cols, 0, 0] }
            }
        }
    }

    /// [`new`](Self::new)'s weights for timing alone.
    fn random(fmt: Format, rows: usize, cols: usize, gs: usize, rng: &mut Rng) -> Weights {
        match fmt {
            Format::Q4 | Format::Q8 => {
                let bits = if fmt == Format::Q4 { 4 } else { 8 };
                let groups = rows * cols / gs;
                let scale = bf16::from_f32(2.0 / ((1 << bits) - 1) as f32);
                let sb = bf16_bytes(&vec![scale; groups]);
                let bb = bf16_bytes(&vec![bf16::from_f32(-1.0); groups]);
                let g = 2 * cols / gs;
                let wb = rng.bytes(rows * cols * bits / 8);
                Weights { matrix: None, bytes: [wb, sb, bb], row_bytes: [cols * bits / 8, g, g] }
            }
            Format::Bf16 | Format::F32 => {
                let w = rng.vec(rows * cols);
                let wb = if fmt == Format::Bf16 {
                    bf16_bytes(&w.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>())
                } else {
                    to_bytes(&bits(&w))
                };
                let esize = wb.len() / (rows * cols);
                Weights { matrix: None, bytes: [wb, Vec::new(), Vec::new()], row_bytes: [esize * cols, 0, 0] }
            }
        }
    }

    /// The loader's view, which the reference reads.
    pub fn matrix(&self) -> &Matrix {
        self.matrix.as_ref().expect("weights built with Want::InputsOnly have no reference view")
    }

    /// The GPU buffers of rows [row0, row0 + n) (one part of a split matrix); the unused scales
    /// and biases of float formats are one dummy word, as in the real program.
    pub fn part(&self, row0: usize, n: usize) -> [Vec<u8>; 3] {
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

pub fn is_quant(fmt: Format) -> bool {
    matches!(fmt, Format::Q4 | Format::Q8)
}

pub const EPS: f32 = 1e-6;

// ---------------------------------------------------------------------------------------------
// The table

/// Every case the main test runs, family by family.
pub fn all_cases() -> Vec<Box<dyn Case>> {
    let mut v = matmul::matmul_cases();
    v.extend(small::embed_cases());
    v.extend(norms::norm_cases());
    v.extend(norms::head_cases());
    v.extend(attention::attention_cases());
    v.extend(small::gelu_cases());
    v.extend(small::argmax_cases());
    v.extend(small::router_cases());
    v.extend(moe::moe_matmul_cases());
    v.extend(moe::group_cases());
    v.extend(moe::combine_cases());
    v.extend(matmul::norm_qmv_cases());
    v.extend(qmm::group_sum_cases());
    v
}
