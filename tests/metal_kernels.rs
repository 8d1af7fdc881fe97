//! The Metal kernels' parts alone, through the MSL emulator, against `kestrel::reference`.
//!
//! The decode step's mat-vec (`quad_dot` in msl/decode.metal, run by msl/tests/matvec_check.metal)
//! in every weight format the kernels read — bf16, f16, f32, MLX 4- and 8-bit at group sizes 32
//! and 64 — over shapes with partial row quads and column counts that leave lanes idle, for
//! 1, 3 and 8 tokens. Two checks per case:
//! - against `reference::matmul` (f64 sums of the same dequantised weights) by NMSE ≤ 1e-9: a
//!   lane sums ⌈cols / 32 / values-per-word⌉ words' products in f32, then five butterfly adds, so
//!   a row's error is at most ≈ (cols/32 + 5) · 2^-24 of Σ|w·x| (≤ 1.3e-6 at 320 columns); for
//!   the random ±1 data here Σ|w·x| / |y| ≈ √(π·cols/2) ≈ 22, so |Δy|/|y| ≤ 3e-5 and NMSE ≤ 1e-9;
//! - bitwise, every token's row against the same token run alone (M = 1): the property that makes
//!   a verify row a decode step's.
//!
//! One query head as the step finishes and attends it (`head_finish`: q_norm and rope, the
//! partner elements exchanged through memory; `attend_head`: online softmax over a ring of
//! cached rows) for head dims that fill 1, 2, 3, 8 and 16 registers a lane and windows that wrap
//! the ring, against `reference::{rmsnorm, rope, attend}` by NMSE ≤ 1e-9: the norm and rope are a
//! few roundings per element; the softmax's f32 exponentials and running rescales keep each
//! weight within ≈ 1e-6 relative of the f64 reference over ≤ 100 keys, so the output's relative
//! error stays ≈ 1e-6 (NMSE ≈ 1e-12), with three orders of margin.

use kestrel::backend::metal::emu::{AlignedBytes, Binding, DispatchOptions, EmuBuild, EmuLibrary};
use kestrel::backend::metal::pack::{FMT_BF16, FMT_F16, FMT_F32, H_DESC_BASE, H_WORDS};
use kestrel::quant::{self, QuantLayout};
use kestrel::reference::{self, MatrixRows};

const GRID_SYNC: &str = include_str!("../msl/grid_sync.metal");
const DECODE: &str = include_str!("../msl/decode.metal");
const CHECK: &str = include_str!("../msl/tests/matvec_check.metal");
const ATTENTION: &str = include_str!("../msl/tests/attention_check.metal");

fn lib() -> EmuLibrary {
    let files = [
        ("grid_sync.metal", GRID_SYNC),
        ("decode.metal", DECODE),
        ("matvec_check.metal", CHECK),
        ("attention_check.metal", ATTENTION),
    ];
    EmuLibrary::build(&EmuBuild { files: &files, defines: &[], cxx: None }).unwrap_or_else(|e| panic!("{e}"))
}

fn bytes_of<T: bytemuck::Pod>(v: &[T]) -> AlignedBytes {
    AlignedBytes::from_slice(bytemuck::cast_slice(v))
}

fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// A weight matrix as stored (arena words) and as the reference reads it (dequantised rows).
struct Case {
    words: Vec<u32>,
    desc: [u32; 8],
    rows_f32: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl MatrixRows for Case {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn name(&self) -> &str {
        "matvec_check"
    }
    fn row_f32(&self, r: usize, out: &mut [f32]) {
        out.copy_from_slice(&self.rows_f32[r * self.cols..(r + 1) * self.cols]);
    }
}

fn case(fmt: &str, rows: usize, cols: usize, gs: usize, seed: u64) -> Case {
    let w = pseudo_random(rows * cols, seed);
    let (rows_u, cols_u) = (rows as u32, cols as u32);
    match fmt {
        "f32" => Case {
            words: w.iter().map(|v| v.to_bits()).collect(),
            desc: [FMT_F32, rows_u, cols_u, 0, 0, 0, 0, 0],
            rows_f32: w,
            rows,
            cols,
        },
        "bf16" | "f16" => {
            let halves: Vec<u16> = if fmt == "bf16" {
                w.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect()
            } else {
                w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect()
            };
            let back: Vec<f32> = if fmt == "bf16" {
                halves.iter().map(|&h| half::bf16::from_bits(h).to_f32()).collect()
            } else {
                halves.iter().map(|&h| half::f16::from_bits(h).to_f32()).collect()
            };
            let words = bytemuck::cast_slice::<u16, u32>(&halves).to_vec();
            let code = if fmt == "bf16" { FMT_BF16 } else { FMT_F16 };
            Case { words, desc: [code, rows_u, cols_u, 0, 0, 0, 0, 0], rows_f32: back, rows, cols }
        }
        _ => {
            let bits = if fmt == "q4" { 4 } else { 8 };
            let q = quant::quantize(&w, rows, cols, bits, gs);
            let layout = QuantLayout { rows, cols, bits, group_size: gs };
            let sb: Vec<u8> = q.scales.iter().flat_map(|s| s.to_bits().to_le_bytes()).collect();
            let bb: Vec<u8> = q.biases.iter().flat_map(|s| s.to_bits().to_le_bytes()).collect();
            let wb: Vec<u8> = bytemuck::cast_slice(&q.words).to_vec();
            let mut rows_f32 = vec![0.0f32; rows * cols];
            for r in 0..rows {
                quant::dequant_row(&layout, &wb, &sb, &bb, r, &mut rows_f32[r * cols..(r + 1) * cols]);
            }
            let mut words = q.words.clone();
            let s_off = words.len() as u32;
            words.extend(bytemuck::pod_collect_to_vec::<u8, u32>(&pad4(&sb)));
            let b_off = words.len() as u32;
            words.extend(bytemuck::pod_collect_to_vec::<u8, u32>(&pad4(&bb)));
            Case { words, desc: [bits, rows_u, cols_u, 0, s_off, b_off, gs as u32, 0], rows_f32, rows, cols }
        }
    }
}

fn pad4(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    v.resize(b.len().div_ceil(4) * 4, 0);
    v
}

/// Runs matvec_check on `nt` tokens of `x`; returns y, token t at t · rows.
fn run(l: &EmuLibrary, c: &Case, x: &[f32], nt: usize) -> Vec<f32> {
    let mut table = vec![0u32; H_WORDS + 8];
    table[H_DESC_BASE] = H_WORDS as u32;
    table[H_WORDS..].copy_from_slice(&c.desc);
    let mut bufs = [
        bytes_of(&table),
        bytes_of(&c.words),
        bytes_of(&x[..nt * c.cols]),
        bytes_of(&vec![f32::NAN; nt * c.rows]),
        bytes_of(&[nt as u32, 0, 0, 0]),
    ];
    let mut bindings: Vec<Binding> =
        bufs.iter_mut().enumerate().map(|(i, b)| Binding { index: i as u32, bytes: &mut b[..] }).collect();
    l.dispatch("matvec_check", [3, 1, 1], [64, 1, 1], &mut bindings, &[], &DispatchOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    bytemuck::pod_collect_to_vec(&bufs[3][..])
}

#[test]
fn matvec_matches_the_reference_in_every_format_and_token_count() {
    let l = lib();
    let mut n = 0;
    for (fmt, gs) in [("f32", 0), ("bf16", 0), ("f16", 0), ("q4", 32), ("q4", 64), ("q8", 32), ("q8", 64)] {
        for (rows, cols) in [(1, 64), (7, 128), (33, 192), (130, 320)] {
            let seed = (rows * 1000 + cols + gs) as u64;
            let c = case(fmt, rows, cols, gs, seed);
            let x = pseudo_random(8 * cols, seed + 7);
            let alone: Vec<Vec<f32>> = (0..8).map(|t| run(&l, &c, &x[t * cols..], 1)).collect();
            for nt in [1, 3, 8] {
                let y = run(&l, &c, &x, nt);
                let want = reference::matmul(&c, &x[..nt * cols], nt);
                let (mut err, mut norm) = (0.0f64, 0.0f64);
                for (a, b) in y.iter().zip(&want) {
                    err += ((a - b) as f64).powi(2);
                    norm += (*b as f64).powi(2);
                }
                let nmse = err / norm;
                let label = format!("{fmt} gs {gs} {rows}×{cols}, {nt} tokens");
                assert!(nmse <= 1e-9, "{label}: NMSE {nmse:.2e} > 1e-9");
                for t in 0..nt {
                    let row = &y[t * rows..(t + 1) * rows];
                    assert!(
                        row.iter().zip(&alone[t]).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{label}: token {t} differs from the same token alone"
                    );
                }
                n += 1;
            }
        }
    }
    eprintln!("{n} mat-vec cases: within NMSE 1e-9 of the reference, every token bitwise its M = 1 run");
}

#[test]
fn attention_head_matches_the_reference() {
    let l = lib();
    let mut n = 0;
    for d in [32usize, 64, 96, 256, 512] {
        for (first, last, slots) in [(0usize, 0usize, 1usize), (0, 40, 41), (57, 80, 24), (5, 99, 100)] {
            let seed = (d * 131 + last * 7 + slots) as u64;
            let q = pseudo_random(d, seed);
            let k = pseudo_random(slots * d, seed + 1);
            let v = pseudo_random(slots * d, seed + 2);
            let w: Vec<f32> = pseudo_random(d, seed + 3).iter().map(|x| 1.0 + 0.5 * x).collect();
            let inv: Vec<f32> = (0..d / 2).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / d as f32)).collect();
            let (mut cos, mut sin) = (vec![0.0; d / 2], vec![0.0; d / 2]);
            reference::rope_table(&inv, last, &mut cos, &mut sin);
            let eps = 1e-6f32;
            let mut p = vec![d as u32, first as u32, last as u32, slots as u32, eps.to_bits()];
            p.extend(w.iter().chain(&cos).chain(&sin).map(|x| x.to_bits()));
            let mut bufs = [bytes_of(&q), bytes_of(&k), bytes_of(&v), bytes_of(&vec![f32::NAN; d]), bytes_of(&p)];
            let mut bindings: Vec<Binding> =
                bufs.iter_mut().enumerate().map(|(i, b)| Binding { index: i as u32, bytes: &mut b[..] }).collect();
            l.dispatch("attention_check", [1, 1, 1], [32, 1, 1], &mut bindings, &[], &DispatchOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bufs[3][..]);
            let mut qr = q.clone();
            reference::rmsnorm(&mut qr, Some(&w), eps);
            reference::rope(&mut qr, &cos, &sin);
            let mut want = vec![0.0f32; d];
            let row = |c: &[f32], pos: usize| -> Vec<f32> { c[(pos % slots) * d..(pos % slots + 1) * d].to_vec() };
            let (krows, vrows): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
                (0..=last).map(|pos| (row(&k, pos), row(&v, pos))).unzip();
            reference::attend(&qr, first..last + 1, |pos| &krows[pos], |pos| &vrows[pos], &mut want);
            let (mut err, mut norm) = (0.0f64, 0.0f64);
            for (a, b) in got.iter().zip(&want) {
                err += ((a - b) as f64).powi(2);
                norm += (*b as f64).powi(2);
            }
            let nmse = err / norm;
            assert!(nmse <= 1e-9, "head_dim {d}, positions {first}..={last}, ring {slots}: NMSE {nmse:.2e} > 1e-9");
            n += 1;
        }
    }
    eprintln!("{n} attention cases within NMSE 1e-9 of the reference");
}
