//! Single-kernel benchmarks: GPU time of one dispatch (timestamps inside a pass, `reps` back to
//! back), the bytes it must read, the GB/s that implies, and the fraction of the copy
//! bandwidth this device reaches through the same API (the `copy` kernel on 1 GiB, or the
//! adapter's largest binding). Run on the H200 through the device tool:
//!
//! ```sh
//! cargo bench --bench kernels            # all shapes
//! cargo bench --bench kernels -- qmv     # only rows whose kernel label contains "qmv"
//! ```
//!
//! The decode mat-vec shapes are those of E2B and E4B (q/k/v/o, gate/up/down, the LM head)
//! plus the issue's 256 MiB matrix; every one runs through the decode kernel the backend picks
//! (`qmv_shape`) and through the previous one-row-per-workgroup `matmul_q4_t1` for comparison.
//! The last table times the routed-expert decode kernels on 26B-A4B shapes (qmv_moe against
//! the per-pair moe_matmul it replaced). Weights are random bits with finite scales: timing
//! only, the values are checked in tests/kernels.rs.

use kestrel::backend::wgpu::harness::KernelHarness;
use kestrel::backend::wgpu::kernels::{
    fold_grid, matmul_rows, qmv_moe_shape, qmv_shape, Format, Kernel, MatmulParams, MoeMatmulParams, Step, MATMUL_ROWS, MATMUL_TOK, MATMUL_VERIFY_TOK, QMM_TILE,
};

struct Shape {
    name: &'static str,
    rows: usize,
    cols: usize,
}

const SHAPES: &[Shape] = &[
    Shape { name: "256 MiB", rows: 16384, cols: 32768 },
    Shape { name: "E2B q_proj", rows: 2048, cols: 1536 },
    Shape { name: "E2B k_proj", rows: 256, cols: 1536 },
    Shape { name: "E2B gate/up", rows: 6144, cols: 1536 },
    Shape { name: "E2B down", rows: 1536, cols: 6144 },
    Shape { name: "E2B LM head", rows: 262144, cols: 1536 },
    Shape { name: "E4B q_proj", rows: 2048, cols: 2560 },
    Shape { name: "E4B gate/up", rows: 10240, cols: 2560 },
    Shape { name: "E4B down", rows: 2560, cols: 10240 },
    Shape { name: "E4B LM head", rows: 262144, cols: 2560 },
];

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(n);
    v
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
    let mut h = match KernelHarness::new() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("no GPU: {e}");
            return;
        }
    };
    println!("device: {}", h.gpu().describe());
    let copy = match h.copy_roofline() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot time kernels here: {e}");
            return;
        }
    };
    println!("copy roofline (copy kernel, read + write): {copy:.0} GB/s\n");
    println!("| shape | rows × cols | kernel | µs | GB read | GB/s | % of copy |");
    println!("|---|---|---|---|---|---|---|");
    let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
    let max_binding = h.gpu().limits.max_storage_buffer_binding_size as usize;
    for sh in SHAPES {
        let (rows, cols) = (sh.rows, sh.cols);
        let w_bytes = rows * cols / 2;
        if w_bytes > max_binding {
            println!("| {} | {rows} × {cols} | skipped: {w_bytes} bytes exceed one binding here | | | | |", sh.name);
            continue;
        }
        let groups = rows * cols / 64;
        let w = random_bytes(w_bytes, rows as u64 * 31 + cols as u64);
        // bf16 0.01 everywhere: finite scales and biases.
        let sb: Vec<u8> = std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), groups).flatten().collect();
        let bytes = (w_bytes + 2 * sb.len() + 4 * cols) as f64;
        let mut variants: Vec<(Kernel, u32, u32)> = Vec::new();
        for tok in [1, MATMUL_VERIFY_TOK] {
            if let Some((k, per_wg)) = qmv_shape(rows, cols, cols, tok) {
                variants.push((k, per_wg, tok));
            }
        }
        variants.push((Kernel::Matmul(Format::Q4, 1), matmul_rows(1), 1));
        // `--sweep`: every lanes × rows-per-team shape of the decode qmv (the data behind
        // `qmv_shape`'s rule).
        if std::env::args().any(|a| a == "--sweep") {
            for lanes in [8u32, 16, 32, 64, 128] {
                for rpt in [1u32, 2, 4] {
                    if (lanes as usize) <= cols / 32 * 2 {
                        variants.push((Kernel::Qmv { tok: 1, lanes, rpt }, 128 / lanes * rpt, 1));
                    }
                }
            }
        }
        for (kernel, per_wg, tok) in variants {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let n = tok as usize;
            let x = random_bytes(4 * cols * n, 7).chunks(4).flat_map(|_| 0.5f32.to_le_bytes()).collect::<Vec<u8>>();
            let y = vec![0u8; 4 * rows * n];
            let p = MatmulParams { rows: rows as u32, cols: cols as u32, gs: 64, x_stride: cols as u32, y_stride: rows as u32, y_off: 0, count_sel: 0, _pad: 0 };
            let step = Step { n_tokens: n as u32, n_out: 1, out_row0: n as u32 - 1, ..Default::default() };
            let (gx, gz) = fold_grid((rows as u32).div_ceil(per_wg), max_groups);
            let reps = if bytes > 1e8 { 20 } else { 200 };
            match h.time(kernel, &[w.clone(), sb.clone(), sb.clone(), x, y], bytemuck::bytes_of(&p), step, (gx, 1, gz), reps) {
                Ok(us) => {
                    let gbs = bytes / us / 1e3;
                    println!("| {} | {rows} × {cols} | {label} | {us:.2} | {:.4} | {gbs:.0} | {:.1} % |", sh.name, bytes / 1e9, 100.0 * gbs / copy);
                }
                Err(e) => println!("| {} | {rows} × {cols} | {label} | error: {e} | | | |", sh.name),
            }
        }
    }

    // Prefill: one 128-token chunk through the tiled mat-mat (qmm) and the 8-token matmul tile.
    let tokens = 128usize;
    println!("\n| shape | rows × cols × tokens | kernel | µs | TFLOP/s | weight GB/s |");
    println!("|---|---|---|---|---|---|");
    for sh in SHAPES.iter().filter(|s| s.rows < 65536 && s.rows * s.cols <= 64 << 20) {
        let (rows, cols) = (sh.rows, sh.cols);
        let groups = rows * cols / 64;
        let w = random_bytes(rows * cols / 2, rows as u64 * 17 + cols as u64);
        let sb: Vec<u8> = std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), groups).flatten().collect();
        let x: Vec<u8> = std::iter::repeat_n(0.5f32.to_le_bytes(), tokens * cols).flatten().collect();
        let y = vec![0u8; 4 * rows * tokens];
        let p = MatmulParams { rows: rows as u32, cols: cols as u32, gs: 64, x_stride: cols as u32, y_stride: rows as u32, y_off: 0, count_sel: 0, _pad: 0 };
        let step = Step { n_tokens: tokens as u32, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        for (kernel, per_wg, tile) in [(Kernel::Qmm, QMM_TILE, QMM_TILE), (Kernel::Matmul(Format::Q4, MATMUL_TOK), matmul_rows(MATMUL_TOK), MATMUL_TOK)] {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let (gx, gz) = fold_grid((rows as u32).div_ceil(per_wg), max_groups);
            let grid = (gx, (tokens as u32).div_ceil(tile), gz);
            match h.time(kernel, &[w.clone(), sb.clone(), sb.clone(), x.clone(), y.clone()], bytemuck::bytes_of(&p), step, grid, 10) {
                Ok(us) => {
                    let flops = 2.0 * (rows * cols * tokens) as f64;
                    println!("| {} | {rows} × {cols} × {tokens} | {label} | {us:.1} | {:.2} | {:.0} |", sh.name, flops / us / 1e6, (w.len() + 2 * sb.len()) as f64 / us / 1e3);
                }
                Err(e) => println!("| {} | {rows} × {cols} × {tokens} | {label} | error: {e} | | |", sh.name),
            }
        }
    }

    // Routed experts, one decode token (26B-A4B: 128 experts, top 8): the fused gate_up half
    // (704 rows of a 1408-row expert, 2816 cols) and down (2816 rows × 704), through the 4-bit
    // decode kernel the backend picks (qmv_moe) and the per-pair kernel it replaced.
    println!("\n| 26B experts (top 8 of 128, 1 token) | rows × cols per expert | kernel | µs | GB read | GB/s | % of copy |");
    println!("|---|---|---|---|---|---|---|");
    let (experts, top_k) = (128usize, 8usize);
    for (name, rows, cols, stride, per_slot) in [("gate (fused gate_up)", 704usize, 2816usize, 1408usize, false), ("down", 2816, 704, 2816, true)] {
        let total_rows = experts * stride;
        if total_rows * cols / 2 > max_binding {
            println!("| {name} | {rows} × {cols} | skipped: the expert stack exceeds one binding here | | | | |");
            continue;
        }
        let w = random_bytes(total_rows * cols / 2, 99 + rows as u64);
        let sb: Vec<u8> = std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), total_rows * cols / 64).flatten().collect();
        let idx: Vec<u8> = (0..top_k as u32).flat_map(|j| (j * 13 % experts as u32).to_le_bytes()).collect();
        let (x_tok, x_slot) = if per_slot { (top_k * cols, cols) } else { (cols, 0) };
        let x: Vec<u8> = std::iter::repeat_n(0.5f32.to_le_bytes(), x_tok).flatten().collect();
        let y = vec![0u8; 4 * top_k * rows];
        let p = MoeMatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: 64,
            expert_stride: stride as u32,
            row_off: 0,
            top_k: top_k as u32,
            x_tok_stride: x_tok as u32,
            x_slot_stride: x_slot as u32,
            y_stride: rows as u32,
            group_stride: 0,
            ..Default::default()
        };
        let step = Step { n_tokens: 1, n_out: 1, ..Default::default() };
        // Bytes one token reads: its 8 experts' rows, scales and biases.
        let bytes = (top_k * rows * (cols / 2 + 2 * 2 * cols / 64)) as f64;
        let mut variants = vec![(Kernel::MoeMatmul(Format::Q4), MATMUL_ROWS)];
        if let Some(v) = qmv_moe_shape(rows, cols, top_k, x_tok, x_slot) {
            variants.insert(0, v);
        }
        for (kernel, per_wg) in variants {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let grid = ((rows as u32).div_ceil(per_wg), top_k as u32, 1);
            match h.time(kernel, &[w.clone(), sb.clone(), sb.clone(), idx.clone(), x.clone(), y.clone()], bytemuck::bytes_of(&p), step, grid, 100) {
                Ok(us) => {
                    let gbs = bytes / us / 1e3;
                    println!("| {name} | {rows} × {cols} | {label} | {us:.2} | {:.4} | {gbs:.0} | {:.1} % |", bytes / 1e9, 100.0 * gbs / copy);
                }
                Err(e) => println!("| {name} | {rows} × {cols} | {label} | error: {e} | | | |"),
            }
        }
    }
}
