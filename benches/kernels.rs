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
//! (`qmv_shape`) and through the previous one-row-per-workgroup `matmul_q4_t1` for comparison,
//! timed twice: re-reading one copy of the weights (L2-resident when it fits) and cycling
//! through copies, so that each dispatch reads them from memory as a decode step does. The 26B's
//! router (128 × 2816, 8-bit in MLX checkpoints) adds the 8-bit `matmul_q8_t1` the backend runs
//! for it beside the 4-bit kernels of its shape.
//! `KBENCH_SHAPES="256 MiB,E4B gate|up"` keeps only the decode shapes whose names contain one of
//! those. The next table times the routed-expert decode kernels on 26B-A4B shapes (qmv_moe against
//! the per-pair moe_matmul it replaced), then the prefill attention on a 512-token chunk.
//! The latency table times the small kernels a decode step is made of (rmsnorm with 0/1/3
//! chained norms, qkv_norm_rope, split attention and its merge at 131–4097 keys, the 26B
//! router's top-k) as chains of dependent dispatches, next to a 16-byte copy: what each costs inside a
//! step beyond the barrier; a ladder under the norm (one workgroup's copies of 4 and 10 KiB,
//! norms with only their sum) separates its memory rounds from its reductions. Weights are random bits with finite scales: timing only, the values
//! are checked in tests/kernels.rs.

use kestrel::backend::wgpu::harness::KernelHarness;
use kestrel::kernels::{
    attention_chunk, attention_chunk_coop, attention_short, attention_split, chain_layout, chain_params, fold_grid,
    group_sum_groups_x, matmul_rows, qmm_shape, qmm_splits, qmv_moe_shape, qmv_shape, rmsnorm, rmsnorm_rows,
    AttnParams, BarrierParams, ChainPrefetch, CopyParams, Format, GroupSumParams, Kernel, MatmulParams,
    MoeMatmulParams, NormParams, QkvParams, RouterParams, Step, Tuning, ATTN_BQ, ATTN_COOP_BQ, ATTN_SPLITS,
    HEAD_NORM_WG, MATMUL_ROWS, MATMUL_TOK, MATMUL_VERIFY_TOK, QMM_TOK,
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
    // The stacked matrices the backend uploads (q|k|v, gate|up as one matrix).
    Shape { name: "E2B q|k|v", rows: 2560, cols: 1536 },
    Shape { name: "E2B gate|up", rows: 12288, cols: 1536 },
    Shape { name: "E4B q|k|v", rows: 3072, cols: 2560 },
    Shape { name: "E4B gate|up", rows: 20480, cols: 2560 },
    // The mat-vecs whose rows the rule leaves at two chunks a lane or fewer (the attention's o
    // projection, Gemma 4's per-layer projection): the float loop.
    Shape { name: "E2B o_proj", rows: 1536, cols: 2048 },
    Shape { name: "E2B per-layer proj", rows: 1536, cols: 256 },
    Shape { name: "E4B o_proj", rows: 2560, cols: 2048 },
    Shape { name: "E4B per-layer proj", rows: 2560, cols: 256 },
    // The 26B's router: 8-bit in MLX checkpoints, so the backend runs the generic matmul
    // (matmul_q8_t1) where 4-bit matrices get the tuned qmv. The table times it against the
    // 4-bit kernels of the same shape: what an 8-bit qmv could gain (decode only).
    Shape { name: "26B router", rows: 128, cols: 2816 },
];

/// Bytes the decode mat-vec table's cold timing cycles through (several times the H200's L2).
const ROTATE_BYTES: usize = 256 << 20;

/// `n` f32s of value `v`, as bytes (the latency table's inputs: timing only).
fn filled_f32s(n: usize, v: f32) -> Vec<u8> {
    std::iter::repeat_n(v.to_le_bytes(), n).flatten().collect()
}

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
    // The kernels as the backend compiles them, or with KESTREL_TUNING's settings (subgroups,
    // shader checks, the digit loop).
    let mut tuning = Tuning::default();
    if let Ok(list) = std::env::var("KESTREL_TUNING") {
        if let Err(e) = tuning.apply(&list) {
            eprintln!("KESTREL_TUNING: {e}");
            return;
        }
    }
    let mut h = match KernelHarness::new(&tuning) {
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
    // µs (L2): one copy of the buffers, re-read by every dispatch (it stays in the 50 MB L2 when
    // it fits); µs (memory): dispatches cycle through copies of ≥ 256 MiB in all, so each reads
    // its weights from memory as a decode step does. GB/s and % from the latter.
    println!("| shape | rows × cols | kernel | µs (L2) | µs (memory) | GB read | GB/s | % of copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
    let max_binding = h.gpu().limits.max_storage_buffer_binding_size as usize;
    // KBENCH_SHAPES="256 MiB,E4B gate|up": only the decode shapes whose names contain one of these.
    let only: Vec<String> =
        std::env::var("KBENCH_SHAPES").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default();
    for sh in SHAPES.iter().filter(|s| only.is_empty() || only.iter().any(|o| s.name.contains(o.as_str()))) {
        let (rows, cols) = (sh.rows, sh.cols);
        let w_bytes = rows * cols / 2;
        if w_bytes > max_binding {
            println!("| {} | {rows} × {cols} | skipped: {w_bytes} bytes exceed one binding here | | | | |", sh.name);
            continue;
        }
        let groups = rows * cols / 64;
        // The router's rows also as 8-bit (twice the bytes; the 4-bit kernels read the first half).
        let q8 = sh.name.contains("router");
        let w = random_bytes(if q8 { 2 * w_bytes } else { w_bytes }, rows as u64 * 31 + cols as u64);
        // bf16 0.01 everywhere: finite scales and biases.
        let sb: Vec<u8> =
            std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), groups).flatten().collect();
        let mut variants: Vec<(Kernel, u32, u32)> = Vec::new();
        for tok in [1, MATMUL_VERIFY_TOK] {
            if let Some((k, per_wg)) = qmv_shape(rows, cols, cols, tok) {
                variants.push((k, per_wg, tok));
            }
        }
        variants.push((Kernel::Matmul(Format::Q4, 1), matmul_rows(1), 1));
        if q8 {
            variants.push((Kernel::Matmul(Format::Q8, 1), matmul_rows(1), 1));
        }
        // `--sweep`: every lanes × rows-per-team shape of the decode qmv (the data behind
        // `qmv_shape`'s rule).
        if std::env::args().any(|a| a == "--sweep") {
            for lanes in [8u32, 16, 32, 64, 128] {
                for rpt in [1u32, 2, 4, 8] {
                    if (lanes as usize) <= cols / 32 * 2 {
                        variants.push((
                            Kernel::Qmv { tok: 1, lanes, rpt, pro: 0, digits: false },
                            128 / lanes * rpt,
                            1,
                        ));
                    }
                }
            }
        }
        for (kernel, per_wg, tok) in variants {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let w_read = if matches!(kernel, Kernel::Matmul(Format::Q8, _)) { 2 * w_bytes } else { w_bytes };
            let bytes = (w_read + 2 * sb.len() + 4 * cols) as f64;
            let n = tok as usize;
            let x = random_bytes(4 * cols * n, 7).chunks(4).flat_map(|_| 0.5f32.to_le_bytes()).collect::<Vec<u8>>();
            let y = vec![0u8; 4 * rows * n];
            let p = MatmulParams {
                rows: rows as u32,
                cols: cols as u32,
                gs: 64,
                x_stride: cols as u32,
                y_stride: rows as u32,
                y_off: 0,
                count_sel: 0,
                k_splits: 0,
            };
            let step = Step { n_tokens: n as u32, n_out: 1, out_row0: n as u32 - 1, ..Default::default() };
            let (gx, gz) = fold_grid((rows as u32).div_ceil(per_wg), max_groups);
            let reps = if bytes > 1e8 { 20 } else { 200 };
            let bufs = [w[..w_read].to_vec(), sb.clone(), sb.clone(), x, y];
            let copies = (ROTATE_BYTES / bytes as usize).clamp(1, 64);
            let timed = h.time(kernel, &bufs, bytemuck::bytes_of(&p), step, (gx, 1, gz), reps).and_then(|warm| {
                h.time_cold(kernel, &bufs, bytemuck::bytes_of(&p), step, (gx, 1, gz), reps, copies)
                    .map(|cold| (warm, cold))
            });
            match timed {
                Ok((warm, us)) => {
                    let gbs = bytes / us / 1e3;
                    println!(
                        "| {} | {rows} × {cols} | {label} | {warm:.2} | {us:.2} | {:.4} | {gbs:.0} | {:.1} % |",
                        sh.name,
                        bytes / 1e9,
                        100.0 * gbs / copy
                    );
                }
                Err(e) => println!("| {} | {rows} × {cols} | {label} | error: {e} | | | | |", sh.name),
            }
        }
    }

    // Prefill: one 512-token chunk (the backend's default) through the tiled mat-mat (qmm, both
    // row tiles, the k loop whole or split into 2, 4, 8 ranges: the time is the split dispatch
    // plus its qmm_sum) and the 8-token matmul tile. `*` marks the variant the backend picks.
    let tokens = 512usize;
    println!("\n| shape | rows × cols × tokens | kernel | k splits | µs | TFLOP/s | weight GB/s |");
    println!("|---|---|---|---|---|---|---|");
    for sh in SHAPES.iter().filter(|s| s.rows < 65536 && s.rows * s.cols <= 64 << 20 && !s.name.contains("router")) {
        let (rows, cols) = (sh.rows, sh.cols);
        let groups = rows * cols / 64;
        let w = random_bytes(rows * cols / 2, rows as u64 * 17 + cols as u64);
        let sb: Vec<u8> =
            std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), groups).flatten().collect();
        let x: Vec<u8> = std::iter::repeat_n(0.5f32.to_le_bytes(), tokens * cols).flatten().collect();
        let xsum: Vec<u8> = std::iter::repeat_n(32f32.to_le_bytes(), tokens * cols / 64).flatten().collect();
        let p = MatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: 64,
            x_stride: cols as u32,
            y_stride: rows as u32,
            y_off: 0,
            count_sel: 0,
            k_splits: 0,
        };
        let step = Step { n_tokens: tokens as u32, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let coop = h.gpu().coop_f16();
        let picked = qmm_shape(rows, coop);
        let picked = (picked.0, qmm_splits(coop, rows, cols, tokens, picked.1, picked.2));
        let mut variants = Vec::new();
        let mut tiles = vec![(Kernel::Qmm { tm: 8 }, 128, QMM_TOK), (Kernel::Qmm { tm: 4 }, 64, QMM_TOK)];
        if coop {
            for (tb, rb) in [(1, 2), (2, 2), (1, 4), (2, 4)] {
                tiles.push((Kernel::QmmCoop { tb, rb }, 32 * rb, 64 * tb));
            }
        }
        for (kernel, per_wg, tok) in tiles {
            for splits in [1u32, 2, 4, 8] {
                if cols % (64 * splits as usize) == 0 {
                    variants.push((kernel, per_wg, tok, splits));
                }
            }
        }
        variants.push((Kernel::Matmul(Format::Q4, MATMUL_TOK), matmul_rows(MATMUL_TOK), MATMUL_TOK, 1));
        for (kernel, per_wg, tile, splits) in variants {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let (gx, gz) = fold_grid((rows as u32).div_ceil(per_wg), max_groups);
            let grid = (gx, (tokens as u32).div_ceil(tile) * splits, gz);
            let y = vec![0u8; 4 * rows * tokens * splits as usize];
            let ps = MatmulParams { k_splits: splits, ..p };
            // The tensor-core form also reads x's group sums: their pass is part of its time.
            let coop = matches!(kernel, Kernel::QmmCoop { .. });
            let mut bufs = vec![w.clone(), sb.clone(), sb.clone(), x.clone(), y.clone()];
            if coop {
                bufs.push(xsum.clone());
            }
            let mut us = h.time(kernel, &bufs, bytemuck::bytes_of(&ps), step, grid, 10);
            if coop {
                let gp =
                    GroupSumParams { cols: cols as u32, gs: 64, stride: cols as u32, mult: 1, ..Default::default() };
                let sums = h.time(
                    Kernel::GroupSum,
                    &[x.clone(), xsum.clone()],
                    bytemuck::bytes_of(&gp),
                    step,
                    (group_sum_groups_x(cols / 64), tokens as u32, 1),
                    10,
                );
                us = us.and_then(|a| sums.map(|b| a + b));
            }
            if splits > 1 {
                let out = vec![0u8; 4 * rows * tokens];
                let sum = h.time(
                    Kernel::QmmSum,
                    &[y, out],
                    bytemuck::bytes_of(&ps),
                    step,
                    ((rows as u32).div_ceil(256), tokens as u32, 1),
                    10,
                );
                us = us.and_then(|a| sum.map(|b| a + b));
            }
            let mark = if (kernel, splits) == picked { " *" } else { "" };
            match us {
                Ok(us) => {
                    let flops = 2.0 * (rows * cols * tokens) as f64;
                    println!(
                        "| {} | {rows} × {cols} × {tokens} | {label}{mark} | {splits} | {us:.1} | {:.2} | {:.0} |",
                        sh.name,
                        flops / us / 1e6,
                        (w.len() + 2 * sb.len()) as f64 / us / 1e3
                    );
                }
                Err(e) => {
                    println!("| {} | {rows} × {cols} × {tokens} | {label} | {splits} | error: {e} | | |", sh.name)
                }
            }
        }
    }

    // x's group sums for the tensor-core mat-mats (group_sum.wgsl), one 512-token chunk.
    println!("\n| x of a 512-token chunk | cols | kernel | µs | GB/s |");
    println!("|---|---|---|---|---|");
    for cols in [1536usize, 2560, 6144, 10240] {
        let x: Vec<u8> = (0..tokens * cols).flat_map(|i| ((i % 7) as f32 * 0.25).to_le_bytes()).collect();
        let xsum = vec![0u8; 4 * tokens * cols / 64];
        let gp = GroupSumParams { cols: cols as u32, gs: 64, stride: cols as u32, mult: 1, ..Default::default() };
        let step = Step { n_tokens: tokens as u32, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let kernel = Kernel::GroupSum;
        let label = kernel.label();
        if !label.contains(&filter) {
            continue;
        }
        match h.time(
            kernel,
            &[x.clone(), xsum.clone()],
            bytemuck::bytes_of(&gp),
            step,
            (group_sum_groups_x(cols / 64), tokens as u32, 1),
            10,
        ) {
            Ok(us) => println!(
                "| {tokens} × {cols} | {cols} | {label} | {us:.1} | {:.0} |",
                (x.len() + xsum.len()) as f64 / us / 1e3
            ),
            Err(e) => println!("| {tokens} × {cols} | {cols} | {label} | error: {e} | |"),
        }
    }

    // The chunk's residual norms, one 512-token chunk (E2B / E4B / 26B widths, mode 2 with its
    // chained input norm; the 26B's with its three): rmsnorm.wgsl's decode form, and
    // rmsnorm_rows.wgsl's chunk form on 64, 128 and 256 threads per row, without and with the
    // chained outputs' group sums (what group_sum's dispatch per mat-mat input costs above).
    println!("\n| residual norm of a 512-token chunk | chained | kernel | µs | GB/s |");
    println!("|---|---|---|---|---|");
    for (n, chain) in [(1536usize, 1u32), (2560, 0), (2560, 1), (2816, 3)] {
        let f32s = |len: usize, v: f32| -> Vec<u8> {
            (0..len).flat_map(|i| (v + (i % 5) as f32 * 0.1).to_le_bytes()).collect()
        };
        let groups = n / 64;
        let p = NormParams {
            n: n as u32,
            segs: 1,
            x_stride: n as u32,
            out_stride: n as u32,
            w_off: 0,
            mode: 2,
            pre: 1.0,
            post: 1.0,
            eps: 1e-6,
            chain,
            w2_off: n as u32,
            w3_off: 2 * n as u32,
            w4_off: 3 * n as u32,
            out2_stride: n as u32,
            post2: 1.0,
            post3: 1.0,
            post4: 1.0,
            gs: 64,
            sums: ((1u32 << (chain + 1)) - 1) & !1,
            sum_off: [0, 0, (tokens * groups) as u32, (2 * tokens * groups) as u32],
            ..Default::default()
        };
        let out = || f32s(tokens * n, 0.0);
        let bufs = vec![
            f32s(tokens * n, 0.5),
            f32s(4 * n, 1.0),
            out(),
            out(),
            out(),
            out(),
            f32s(tokens * n, 0.2),
            vec![0u8; 4 * 3 * tokens * groups],
            f32s(4, 0.0),
        ];
        let step = Step { n_tokens: tokens as u32, n_out: 1, out_row0: tokens as u32 - 1, ..Default::default() };
        let moved = (4 * tokens * n * (3 + chain as usize)) as f64;
        let Kernel::RmsNorm { v, wg, .. } =
            rmsnorm(n, h.gpu().limits.max_compute_invocations_per_workgroup, &Tuning::default())
        else {
            unreachable!("rmsnorm() is a norm")
        };
        let rows = |wg| rmsnorm_rows(&p, wg).expect("the chunk's norms have vec4 rows");
        let forms = [Kernel::RmsNorm { v, wg }].into_iter().chain([64, 128, 256].into_iter().flat_map(|wg| {
            let Kernel::RmsNormRows { v4, .. } = rows(wg) else { unreachable!("rmsnorm_rows() is a rows norm") };
            [false, true].map(|sums| Kernel::RmsNormRows { v4, wg, sums, parts: false })
        }));
        for kernel in forms {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            match h.time(kernel, &bufs, bytemuck::bytes_of(&p), step, (1, tokens as u32, 1), 10) {
                Ok(us) => println!("| {tokens} × {n} | {chain} | {label} | {us:.1} | {:.0} |", moved / us / 1e3),
                Err(e) => println!("| {tokens} × {n} | {chain} | {label} | error: {e} | |"),
            }
        }
    }

    // Routed experts, one decode token (26B-A4B: 128 experts, top 8): the fused gate_up half
    // (704 rows of a 1408-row expert, 2816 cols) and down (2816 rows × 704), through the 4-bit
    // decode kernel the backend picks (qmv_moe) and the per-pair kernel it replaced.
    println!(
        "\n| 26B experts (top 8 of 128, 1 token) | rows × cols per expert | kernel | µs | GB read | GB/s | % of copy |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (experts, top_k) = (128usize, 8usize);
    for (name, rows, cols, stride, per_slot) in
        [("gate (fused gate_up)", 704usize, 2816usize, 1408usize, false), ("down", 2816, 704, 2816, true)]
    {
        let total_rows = experts * stride;
        if total_rows * cols / 2 > max_binding {
            println!("| {name} | {rows} × {cols} | skipped: the expert stack exceeds one binding here | | | | |");
            continue;
        }
        let w = random_bytes(total_rows * cols / 2, 99 + rows as u64);
        let sb: Vec<u8> =
            std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), total_rows * cols / 64)
                .flatten()
                .collect();
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
        if let Some(v) = qmv_moe_shape(rows, cols, top_k, x_tok, x_slot, &Tuning::default()) {
            variants.insert(0, v);
        }
        for (kernel, per_wg) in variants {
            let label = kernel.label();
            if !label.contains(&filter) {
                continue;
            }
            let grid = ((rows as u32).div_ceil(per_wg), top_k as u32, 1);
            match h.time(
                kernel,
                &[w.clone(), sb.clone(), sb.clone(), idx.clone(), x.clone(), y.clone()],
                bytemuck::bytes_of(&p),
                step,
                grid,
                100,
            ) {
                Ok(us) => {
                    let gbs = bytes / us / 1e3;
                    println!(
                        "| {name} | {rows} × {cols} | {label} | {us:.2} | {:.4} | {gbs:.0} | {:.1} % |",
                        bytes / 1e9,
                        100.0 * gbs / copy
                    );
                }
                Err(e) => println!("| {name} | {rows} × {cols} | {label} | error: {e} | | | |"),
            }
        }
    }

    prefill_attention_table(&mut h, &filter);
    latency_table(&mut h, &filter);
    stream_table(&mut h, &filter, copy);
    layout_table(&mut h, &filter);
    persistent_chain_table(&mut h, &filter, copy);
}

/// What one dispatch can stream at a given size, in a dependent chain with its bytes read from
/// memory (dispatches cycling through copies of ≥ 512 MiB in all, as the mat-vec table's memory
/// column): `stream_read` reads the bytes and writes nothing, 1, 2, 4 or 8 vec4s per thread all
/// loaded at once; `copy` (grid-stride, 4 vec4s per thread) reads and writes them. The sizes of
/// the E4B decode mat-vecs' weights (q|k|v, down, gate|up, with their scales: the kbench rows
/// above) and powers of two around them: the floor of one mat-vec of that size is this row, not
/// the 1 GiB copy roofline.
fn stream_table(h: &mut KernelHarness, filter: &str, copy: f64) {
    if !(Kernel::StreamRead { vpt: 1 }).label().contains(filter) {
        return;
    }
    println!("\n| stream (one dispatch, from memory) | bytes read | stream_read µs, 1 / 2 / 4 / 8 vec4s per thread | best GB/s | % of copy | copy µs | copy GB/s (read + write) |");
    println!("|---|---|---|---|---|---|---|");
    let sizes: [(&str, usize); 9] = [
        ("1 MiB", 1 << 20),
        ("E4B q|k|v", 4_423_680),
        ("8 MiB", 8 << 20),
        ("E4B down", 14_745_600),
        ("16 MiB", 16 << 20),
        ("E4B gate|up", 29_491_200),
        ("64 MiB", 64 << 20),
        ("128 MiB", 128 << 20),
        ("256 MiB", 256 << 20),
    ];
    for (name, bytes) in sizes {
        let n = (bytes / 16) as u32;
        let copies = (512usize << 20).div_ceil(bytes).max(2);
        let mut reads = Vec::new();
        let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
        for vpt in [1u32, 2, 4, 8] {
            let grid = (n.div_ceil(256 * vpt), 1, 1);
            if grid.0 > max_groups {
                reads.push(Err(kestrel::Error::Invalid(format!("{} workgroups", grid.0))));
                continue;
            }
            // Zero data and `never` = 1: the OR of zeros never reaches it, so nothing is stored.
            let bufs = [vec![0u8; bytes], vec![0u8; 16 * 256 * grid.0 as usize]];
            reads.push(h.time_cold(
                Kernel::StreamRead { vpt },
                &bufs,
                bytemuck::bytes_of(&CopyParams { n, _pad: [1, 0, 0] }),
                Step::default(),
                grid,
                100,
                copies,
            ));
        }
        let cp = h.time_cold(
            Kernel::Copy,
            &[vec![0u8; bytes], vec![0u8; bytes]],
            bytemuck::bytes_of(&CopyParams { n, _pad: [0; 3] }),
            Step::default(),
            (n.div_ceil(1024), 1, 1),
            100,
            copies,
        );
        let fmt = |r: &kestrel::Result<f64>| r.as_ref().map_or_else(|e| format!("— ({e})"), |us| format!("{us:.2}"));
        let best = reads.iter().filter_map(|r| r.as_ref().ok()).copied().fold(f64::INFINITY, f64::min);
        let gbs = bytes as f64 / best / 1e3;
        let cols: Vec<String> = reads.iter().map(fmt).collect();
        let copy_gbs = cp.as_ref().map_or(0.0, |c| 2.0 * bytes as f64 / c / 1e3);
        println!(
            "| {name} | {bytes} | {} | {gbs:.0} | {:.1} % | {} | {copy_gbs:.0} |",
            cols.join(" / "),
            100.0 * gbs / copy,
            fmt(&cp)
        );
    }
}

/// Whether where the bytes live changes what one dispatch reads (`kbench stream_layout`): the
/// stream table's bare read (2 vec4s per thread) and the decode mat-vecs at E4B and E2B
/// shapes, µs per dispatch in a dependent chain, their buffers read from memory as separate
/// copies placed by wgpu's allocator (the stream and mat-vec tables' form), packed back to back
/// in one arena buffer cycled over 512 MiB or over ≥ 2 GiB (a decode step's span: more
/// address space than a TLB may cover), and from one copy (the L2, where it fits).
fn layout_table(h: &mut KernelHarness, filter: &str) {
    if !filter.is_empty() && !"stream_layout".contains(filter) {
        return;
    }
    println!("\n| where the bytes live | bytes | kernel | separate, ≥ 512 MiB | packed, 512 MiB | packed, ≥ 2 GiB | one copy (L2) |");
    println!("|---|---|---|---|---|---|---|");
    let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
    let rotate = |bytes: usize, span: usize| span.div_ceil(bytes).max(2);
    let row = |h: &mut KernelHarness,
               name: &str,
               bytes: usize,
               kernel: Kernel,
               bufs: &[Vec<u8>],
               params: &[u8],
               step: Step,
               grid: (u32, u32, u32)| {
        let fmt = |r: kestrel::Result<f64>| r.map_or_else(|e| format!("— ({e})"), |us| format!("{us:.2}"));
        let c512 = rotate(bytes, 512 << 20);
        let c2g = rotate(bytes, 2 << 30);
        let sep = fmt(h.time_cold(kernel, bufs, params, step, grid, c512.max(100) as u32, c512));
        let p512 = fmt(h.time_packed(kernel, bufs, params, step, grid, c512.max(100) as u32, c512));
        let p2g = fmt(h.time_packed(kernel, bufs, params, step, grid, c2g.max(100) as u32, c2g));
        let warm = fmt(h.time(kernel, bufs, params, step, grid, 200));
        println!("| {name} | {bytes} | {} | {sep} | {p512} | {p2g} | {warm} |", kernel.label());
    };
    for (name, bytes) in [
        ("1 MiB", 1usize << 20),
        ("E4B q|k|v", 4_423_680),
        ("8 MiB", 8 << 20),
        ("E4B down", 14_745_600),
        ("E4B gate|up", 29_491_200),
    ] {
        let n = (bytes / 16) as u32;
        let grid = (n.div_ceil(256 * 2), 1, 1);
        let bufs = [vec![0u8; bytes], vec![0u8; 16 * 256 * grid.0 as usize]];
        row(
            h,
            name,
            bytes,
            Kernel::StreamRead { vpt: 2 },
            &bufs,
            bytemuck::bytes_of(&CopyParams { n, _pad: [1, 0, 0] }),
            Step::default(),
            grid,
        );
    }
    for name in ["E4B q|k|v", "E4B down", "E4B gate|up", "E2B q|k|v", "E2B down", "E2B gate|up"] {
        let sh = SHAPES.iter().find(|s| s.name == name).expect("a SHAPES entry");
        let (rows, cols) = (sh.rows, sh.cols);
        let Some((kernel, per_wg)) = qmv_shape(rows, cols, cols, 1) else { continue };
        let groups = rows * cols / 64;
        let w = random_bytes(rows * cols / 2, rows as u64 * 31 + cols as u64);
        let sb: Vec<u8> =
            std::iter::repeat_n(half::bf16::from_f32(0.01).to_bits().to_le_bytes(), groups).flatten().collect();
        let x: Vec<u8> = std::iter::repeat_n(0.5f32.to_le_bytes(), cols).flatten().collect();
        let bytes = w.len() + 2 * sb.len();
        let bufs = [w, sb.clone(), sb, x, vec![0u8; 4 * rows]];
        let p = MatmulParams {
            rows: rows as u32,
            cols: cols as u32,
            gs: 64,
            x_stride: cols as u32,
            y_stride: rows as u32,
            y_off: 0,
            count_sel: 0,
            k_splits: 0,
        };
        let step = Step { n_tokens: 1, n_out: 1, out_row0: 0, ..Default::default() };
        let (gx, gz) = fold_grid((rows as u32).div_ceil(per_wg), max_groups);
        row(h, name, bytes, kernel, &bufs, bytemuck::bytes_of(&p), step, (gx, 1, gz));
    }
}

/// Prefill attention (attention.wgsl, and attention_coop.wgsl where the device has tensor cores)
/// over one 512-token chunk from position 0, at E2B's heads (8 query heads on 1 kv head; d 256
/// with the 512-key window, d 512 full) and E4B's (8 on 2): GPU time per dispatch and the
/// TFLOP/s of the causal products it must do (2 · 2 · d flops per attended (query, key) pair
/// per head).
fn prefill_attention_table(h: &mut KernelHarness, filter: &str) {
    let f32s = |n: usize, v: f32| -> Vec<u8> {
        (0..n).flat_map(|i| (v * (1.0 + ((i * 7919) % 97) as f32 / 97.0)).to_le_bytes()).collect()
    };
    let tokens = 512usize;
    println!("\n| prefill attention | heads (q / kv) × d, window | tokens | kernel | µs | TFLOP/s |");
    println!("|---|---|---|---|---|---|");
    let shapes = [
        ("E2B sliding", 8usize, 1usize, 256usize, 512usize),
        ("E2B full", 8, 1, 512, 0),
        ("E4B sliding", 8, 2, 256, 512),
        ("E4B full", 8, 2, 512, 0),
    ];
    let coop = h.gpu().coop_f16();
    let kernels = shapes.into_iter().flat_map(|s| {
        let tc = attention_chunk_coop(s.3).filter(|_| coop).map(|k| (s, k, ATTN_COOP_BQ));
        // And the tensor-core form that also writes its output's group sums (KESTREL_ATTN_SUMS).
        let tc_sums = tc.map(|(s, _, bq)| (s, Kernel::AttentionCoop { d: s.3 as u32, sums: true }, bq));
        [Some((s, attention_chunk(s.3), ATTN_BQ)), tc, tc_sums].into_iter().flatten()
    });
    for ((name, n_q, n_kv, d, window), kernel, bq) in kernels {
        let label = kernel.label();
        if !label.contains(filter) {
            continue;
        }
        let slots = 1024usize;
        let p = AttnParams {
            d: d as u32,
            n_heads: n_q as u32,
            n_kv_heads: n_kv as u32,
            slots: slots as u32,
            window: window as u32,
            n_splits: ATTN_SPLITS,
            short_max: 0,
            _pad: 0,
        };
        let step =
            Step { n_tokens: tokens as u32, n_out: 1, out_row0: tokens as u32 - 1, pos0: 0, ..Default::default() };
        let mut bufs = vec![
            f32s(tokens * n_q * d, 0.05),
            f32s(slots * n_kv * d, 0.05),
            f32s(slots * n_kv * d, 0.3),
            f32s(tokens * n_q * d, 0.0),
        ];
        if matches!(kernel, Kernel::AttentionCoop { sums: true, .. }) {
            // Its output's sums over each 64-dim value stage.
            bufs.push(f32s(tokens * n_q * d / 64, 0.0));
        }
        let pairs: usize = (0..tokens).map(|t| if window > 0 { (t + 1).min(window) } else { t + 1 }).sum();
        let flops = (4 * d * pairs * n_q) as f64;
        match h.time(kernel, &bufs, bytemuck::bytes_of(&p), step, (n_q as u32, (tokens as u32).div_ceil(bq), 1), 20) {
            Ok(us) => println!(
                "| {name} | {n_q} / {n_kv} × {d}, {window} | {tokens} | {label} | {us:.1} | {:.2} |",
                flops / us / 1e6
            ),
            Err(e) => println!("| {name} | {n_q} / {n_kv} × {d} | {tokens} | {label} | error: {e} | |"),
        }
    }
}

/// One grid-wide barrier (fence, atomic arrival, spin, fence: grid_barrier.wgsl) among 132, 264
/// and 528 workgroups (1, 2, 4 per H200 SM: all resident), each dispatch 1000 of them: what a
/// persistent decode kernel would pay between phases, against the dependent dispatch (the copy
/// row) it would replace. A run first counts the reads that saw stale data (on the H200 most
/// did, session 7: such a barrier orders atomics only, not plain stores); the atomic form hands
/// the slots over as atomics (session 20), the hand-off a WGSL "last workgroup" fusion needs. Only on
/// a device with ≥ 132 SMs' worth of concurrent workgroups: elsewhere the grid would not be
/// resident at once and the kernel would spin forever.
fn grid_barrier_rows(h: &mut KernelHarness, filter: &str) {
    for atomic in [false, true] {
        let kernel = Kernel::GridBarrier { atomic };
        let label = kernel.label();
        if !label.contains(filter) {
            continue;
        }
        if !h.gpu().describe().contains("H200") {
            println!("| {label} | skipped: the grid must be resident at once, sized for the H200 only | |");
            continue;
        }
        let rounds = 1000u32;
        let p = BarrierParams { rounds, _pad: [0; 3] };
        let zero = vec![0u8; 4];
        for nwg in [132u32, 264, 528] {
            let bufs = vec![zero.clone(), vec![0u8; 4 * nwg as usize], zero.clone()];
            let errors = h
                .run(kernel, &bufs, bytemuck::bytes_of(&p), Step::default(), (nwg, 1, 1))
                .map(|out| u32::from_le_bytes(out[2][..4].try_into().expect("4 bytes")));
            // 5 dispatches per timed pass: with the harness's warm-up the counter stays far below 2^32.
            match (errors, h.time(kernel, &bufs, bytemuck::bytes_of(&p), Step::default(), (nwg, 1, 1), 5)) {
                (Ok(e), Ok(us)) => println!(
                    "| {label} | {nwg} workgroups, stale reads {e} of {} | {:.2} per barrier |",
                    rounds * nwg,
                    us / rounds as f64
                ),
                (Err(e), _) | (_, Err(e)) => println!("| {label} | {nwg} workgroups | error: {e} |"),
            }
        }
    }
}

/// A producer's workgroups handing their shares of an output to the one that arrives last
/// (last_workgroup.wgsl: store, fence, atomic arrival; the last fences and reads every share),
/// the hand-off a decode fusion would use to run a follower's one-workgroup work (a residual
/// norm, attention_combine) inside its producer instead of a dependent dispatch. Shapes of a
/// decode step's output (2560 values over 640 or 1280 workgroups, E4B's hidden row), a wide
/// share (132 × 256) and no shares (the arrival alone). Stale reads over 2000 dispatches,
/// then µs per dispatch in a dependent chain (the copy row is the floor it would replace).
fn last_workgroup_rows(h: &mut KernelHarness, filter: &str) {
    for atomic in [false, true] {
        let kernel = Kernel::LastWorkgroup { atomic };
        let label = kernel.label();
        if !label.contains(filter) {
            continue;
        }
        for (nwg, per) in [(640u32, 4u32), (1280, 2), (132, 256), (640, 0)] {
            let p = BarrierParams { rounds: per, _pad: [0; 3] };
            let bufs = vec![vec![0u8; 8], vec![0u8; 4 * (nwg * per).max(1) as usize], vec![0u8; 4]];
            let reps = 2000;
            let errors = h
                .run_n(kernel, &bufs, bytemuck::bytes_of(&p), Step::default(), (nwg, 1, 1), reps)
                .map(|out| u32::from_le_bytes(out[2][..4].try_into().expect("4 bytes")));
            match (errors, h.time(kernel, &bufs, bytemuck::bytes_of(&p), Step::default(), (nwg, 1, 1), 200)) {
                (Ok(e), Ok(us)) => println!(
                    "| {label} | {nwg} workgroups × {per} values, stale reads {e} of {} | {us:.2} |",
                    reps * nwg * per
                ),
                (Err(e), _) | (_, Err(e)) => println!("| {label} | {nwg} workgroups × {per} values | error: {e} |"),
            }
        }
    }
}

/// The one-workgroup and small kernels a decode step is made of, each timed as a chain of 200
/// dependent dispatches (each writes what the next overwrites, so every one waits for the
/// last: the per-dispatch cost inside a decode step). The 16-byte `copy` is the floor: a
/// dependent dispatch that does nothing.
fn latency_table(h: &mut KernelHarness, filter: &str) {
    println!("\n| decode kernel (dependent chain) | shape | µs per dispatch |");
    println!("|---|---|---|");
    let f32s = filled_f32s;
    let step = Step { n_tokens: 1, pos0: 130, n_out: 1, ..Default::default() };
    // The decode norm the backend records on this device (kernels::rmsnorm).
    let max_wg = h.gpu().limits.max_compute_invocations_per_workgroup;
    let row = |h: &mut KernelHarness,
               kernel: Kernel,
               shape: String,
               bufs: Vec<Vec<u8>>,
               params: &[u8],
               grid: (u32, u32, u32)| {
        let label = kernel.label();
        if !label.contains(filter) {
            return;
        }
        match h.time(kernel, &bufs, params, step, grid, 200) {
            Ok(us) => println!("| {label} | {shape} | {us:.2} |"),
            Err(e) => println!("| {label} | {shape} | error: {e} |"),
        }
    };
    let p = CopyParams { n: 1, ..Default::default() };
    row(h, Kernel::Copy, "16 bytes".into(), vec![f32s(4, 1.0), f32s(4, 0.0)], bytemuck::bytes_of(&p), (1, 1, 1));
    // The ladder under a one-workgroup norm (session 12): one load and store per thread of one
    // workgroup (4 KiB), three in turn (10 KiB: 2560 floats), the same bytes over 10 workgroups.
    for (vec4s, wgs) in [(256usize, 1u32), (640, 1), (640, 3)] {
        let p = CopyParams { n: vec4s as u32, ..Default::default() };
        row(
            h,
            Kernel::Copy,
            format!("{} KiB, {wgs} workgroup(s)", vec4s * 16 / 1024),
            vec![f32s(4 * vec4s, 1.0), f32s(4 * vec4s, 0.0)],
            bytemuck::bytes_of(&p),
            (wgs, 1, 1),
        );
    }
    grid_barrier_rows(h, filter);
    last_workgroup_rows(h, filter);
    // Then a norm with only the sum: 1 value per thread, then 6, no weight and no residual
    // (mode 0), then with its weight.
    for (n, w_off) in [(256usize, u32::MAX), (1536, u32::MAX), (1536, 0)] {
        let p = NormParams {
            n: n as u32,
            segs: 1,
            x_stride: n as u32,
            out_stride: n as u32,
            w_off,
            mode: 0,
            pre: 1.0,
            post: 1.0,
            eps: 1e-6,
            ..Default::default()
        };
        let bufs = vec![
            f32s(n, 0.5),
            f32s(n, 1.0),
            f32s(n, 0.0),
            f32s(n, 0.0),
            f32s(n, 0.0),
            f32s(n, 0.0),
            f32s(n, 0.0),
            f32s(4, 0.0),
            f32s(4, 0.0),
        ];
        let what = if w_off == u32::MAX { "no weight" } else { "weight" };
        row(
            h,
            rmsnorm(n, max_wg, &Tuning::default()),
            format!("n {n}, mode 0, {what}"),
            bufs,
            bytemuck::bytes_of(&p),
            (1, 1, 1),
        );
    }
    // rmsnorm: a residual post-norm (mode 1) with 0, 1 and 3 chained norms, E2B/E4B/26B widths.
    for n in [1536usize, 2560, 2816] {
        for chain in [0u32, 1, 3] {
            let p = NormParams {
                n: n as u32,
                segs: 1,
                x_stride: n as u32,
                out_stride: n as u32,
                w_off: 0,
                mode: 1,
                pre: 1.0,
                post: 1.0,
                eps: 1e-6,
                chain,
                w2_off: n as u32,
                w3_off: 2 * n as u32,
                w4_off: 3 * n as u32,
                out2_stride: n as u32,
                post2: 1.0,
                post3: 1.0,
                post4: 1.0,
                ..Default::default()
            };
            let bufs = vec![
                f32s(n, 0.5),
                f32s(4 * n, 1.0),
                f32s(n, 0.1),
                f32s(n, 0.0),
                f32s(n, 0.0),
                f32s(n, 0.0),
                f32s(n, 0.2),
                f32s(4, 0.0),
                f32s(4, 0.0),
            ];
            row(
                h,
                rmsnorm(n, max_wg, &Tuning::default()),
                format!("n {n}, chain {chain}"),
                bufs,
                bytemuck::bytes_of(&p),
                (1, 1, 1),
            );
        }
    }
    // q, k, v heads of one token (E2B sliding: 8 + 1 + 1 heads of 256; full: of 512).
    for d in [256usize, 512] {
        let (n_q, n_kv, slots) = (8usize, 1usize, 640usize);
        let stride = (n_q + 2 * n_kv) * d;
        let p = QkvParams {
            d: d as u32,
            src_stride: stride as u32,
            rope_off: 0,
            rope_stride: d as u32,
            n_q: n_q as u32,
            n_kv: n_kv as u32,
            k_off: (n_q * d) as u32,
            v_off: ((n_q + n_kv) * d) as u32,
            q_w: 0,
            k_w: d as u32,
            slots: slots as u32,
            eps: 1e-6,
        };
        let bufs = vec![
            f32s(stride, 0.3),
            f32s(2 * d, 1.0),
            f32s(d, 0.5),
            f32s(n_q * d, 0.0),
            f32s(slots * n_kv * d, 0.0),
            f32s(slots * n_kv * d, 0.0),
        ];
        for wg in [HEAD_NORM_WG, 128, 64].into_iter().filter(|&wg| d <= 4 * wg as usize) {
            row(
                h,
                Kernel::QkvNormRope { wg },
                format!("8 + 1 + 1 heads × {d}"),
                bufs.clone(),
                bytemuck::bytes_of(&p),
                ((n_q + 2 * n_kv) as u32, 1, 1),
            );
        }
    }
    // Decode attention at E2B's sliding heads (8 q heads on 1 kv head, d 256) over 131 keys
    // (step.pos0 = 130), and at 1025 and 4097 keys: the split kernel, then the merge. Then the
    // split kernel with one split at 32–256 keys: what a one-pass attention without the merge
    // dispatch would cost at short contexts (PERF_NOTES.md, session 8, next step 1).
    for (keys, splits) in
        [(131usize, ATTN_SPLITS), (1025, ATTN_SPLITS), (4097, ATTN_SPLITS), (32, 1), (131, 1), (256, 1)]
    {
        let (d, heads, slots) = (256usize, 8usize, 4608usize);
        let p = AttnParams {
            d: d as u32,
            n_heads: heads as u32,
            n_kv_heads: 1,
            slots: slots as u32,
            window: 0,
            n_splits: splits,
            short_max: 0,
            _pad: 0,
        };
        let at = Step { pos0: keys as u32 - 1, ..step };
        let part = f32s(heads * splits as usize * (d + 2), 0.0);
        let kernel = attention_split(d, false);
        if kernel.label().contains(filter) {
            let bufs = vec![f32s(heads * d, 0.1), f32s(slots * d, 0.2), f32s(slots * d, 0.3), part.clone()];
            match h.time(kernel, &bufs, bytemuck::bytes_of(&p), at, (heads as u32, splits, 1), 200) {
                Ok(us) => {
                    println!("| {} | {keys} keys in {splits} split(s), 8 heads × {d} | {us:.2} |", kernel.label())
                }
                Err(e) => println!("| {} | {keys} keys | error: {e} |", kernel.label()),
            }
        }
        if splits > 1 && Kernel::AttentionCombine.label().contains(filter) {
            let bufs = vec![part, f32s(heads * d, 0.0)];
            match h.time(Kernel::AttentionCombine, &bufs, bytemuck::bytes_of(&p), at, (heads as u32, 1, 1), 200) {
                Ok(us) => println!("| attention_combine | {keys} keys in {splits} splits, 8 heads × {d} | {us:.2} |"),
                Err(e) => println!("| attention_combine | error: {e} |"),
            }
        }
    }
    // attention_short (one dispatch per (head, token), every key) against attention_split +
    // attention_combine (two) at the same rows: 16–1025 keys at E2B's sliding heads (d 256),
    // 144 and 512 at its global ones (d 512), 8 q heads on 1 kv head. Which is cheaper by key
    // count sets WgpuOptions::attn_short (PERF_NOTES.md, session 26).
    let limits = h.gpu().device_limits();
    for (d, keys) in
        [(256usize, 16usize), (256, 64), (256, 144), (256, 256), (256, 512), (256, 1025), (512, 144), (512, 512)]
    {
        let (heads, slots) = (8usize, 4608usize);
        let at = Step { pos0: keys as u32 - 1, ..step };
        let kv = vec![f32s(heads * d, 0.1), f32s(slots * d, 0.2), f32s(slots * d, 0.3)];
        let long = AttnParams {
            d: d as u32,
            n_heads: heads as u32,
            n_kv_heads: 1,
            slots: slots as u32,
            window: 0,
            n_splits: ATTN_SPLITS,
            short_max: 0,
            _pad: 0,
        };
        let short = AttnParams { short_max: u32::MAX, ..long };
        let part = f32s(heads * ATTN_SPLITS as usize * (d + 2), 0.0);
        let mut runs = vec![(
            attention_short(d, false, &limits),
            short,
            [kv.clone(), vec![f32s(heads * d, 0.0)]].concat(),
            (heads as u32, 1, 1),
        )];
        runs.push((attention_split(d, false), long, [kv, vec![part.clone()]].concat(), (heads as u32, ATTN_SPLITS, 1)));
        runs.push((Kernel::AttentionCombine, long, vec![part, f32s(heads * d, 0.0)], (heads as u32, 1, 1)));
        for (kernel, p, bufs, grid) in runs.into_iter().filter(|r| r.0.label().contains(filter)) {
            match h.time(kernel, &bufs, bytemuck::bytes_of(&p), at, grid, 200) {
                Ok(us) => println!(
                    "| {} | {keys} keys, 8 heads × {d}{} | {us:.2} |",
                    kernel.label(),
                    if p.short_max == 0 { format!(" in {ATTN_SPLITS} splits") } else { String::new() }
                ),
                Err(e) => println!("| {} | {keys} keys | error: {e} |", kernel.label()),
            }
        }
    }
    // The 26B router: top 8 of 128 experts.
    let p = RouterParams { n_experts: 128, top_k: 8, _pad: [0; 2] };
    let logits: Vec<u8> = (0..128).flat_map(|i| ((i * 37 % 128) as f32 * 0.01).to_le_bytes()).collect();
    row(
        h,
        Kernel::RouterTopk,
        "top 8 of 128".into(),
        vec![logits, f32s(128, 1.0), vec![0u8; 32], f32s(8, 0.0)],
        bytemuck::bytes_of(&p),
        (1, 1, 1),
    );
}

/// Layers of the persistent_chain table's chains (4 stages each: MAX_CHAIN_STAGES in all).
const CHAIN_LAYERS: usize = 32;

/// The persistent decode kernel's question (persistent_chain.wgsl): a chain of 4-bit mat-vecs
/// shaped as 32 layers of E2B or E4B (q|k|v, o, gate|up, down; each stage reads the first values
/// of the one before's output) run as one dispatch per stage — one workgroup per row block, or
/// 132 striding over the blocks — against one persistent dispatch of 132 workgroups (one per
/// H200 SM) with a grid barrier between stages, each workgroup loading its first weights of a
/// stage after the barrier, before it, or inside it (after its arrival). Workgroups of 256, 512
/// and 1024 threads; lanes load `pf` vec4s at once (`KBENCH_CHAIN_PF`, default 4). The same
/// arithmetic in every form, so the differences are the dispatch boundaries, the barriers and
/// where the first loads go. Each form's activations (outputs poisoned before it runs) are
/// checked bitwise against the first's: the hand-off across the grid barrier on a real grid
/// (the kernel test runs one workgroup). H200 only: the persistent grid must be resident at
/// once. Session 23 found 264 workgroups of 256 threads not resident at once (the dispatch
/// spun until killed): one workgroup per SM is what every form here uses.
fn persistent_chain_table(h: &mut KernelHarness, filter: &str, copy: f64) {
    let pf: u32 = std::env::var("KBENCH_CHAIN_PF").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    if !(Kernel::PersistentChain { xcap: 10240, pf, wg: 256 }).label().contains(filter) {
        return;
    }
    println!("\n| chain (32 layers) | form (batches of {pf} vec4s) | threads × workgroups | µs per chain | µs per layer | µs per stage | GB/s | % of copy | same bits |");
    println!("|---|---|---|---|---|---|---|---|---|");
    if !h.gpu().describe().contains("H200") {
        println!("| | skipped: the persistent grid must be resident at once, sized for the H200 only | | | | | | | |");
        return;
    }
    let layers: [(&str, [(u32, u32); 4]); 2] = [
        ("E2B", [(2560, 1536), (1536, 2048), (12288, 1536), (1536, 6144)]),
        ("E4B", [(3072, 2560), (2560, 2048), (20480, 2560), (2560, 10240)]),
    ];
    for (name, layer) in layers {
        let shapes: Vec<(u32, u32)> = (0..CHAIN_LAYERS).flat_map(|_| layer).collect();
        let layout = match chain_layout(&shapes) {
            Ok(l) => l,
            Err(e) => {
                println!("| {name} | error: {e} | | | | | | | |");
                continue;
            }
        };
        // Random nibbles; scale 0.2 / √cols and bias −7.5 scales keep each stage's output near
        // its input's size over 128 stages (finite values, as a model's).
        let w = random_bytes(16 * layout.w_vec4s, 0x5eed ^ layout.w_vec4s as u64);
        let mut sb = Vec::with_capacity(4 * layout.sb_words);
        for st in &layout.stages {
            let s = half::bf16::from_f32(0.2 / (st.cols as f32).sqrt());
            let b = half::bf16::from_f32(-7.5 * s.to_f32());
            let word = u32::from(s.to_bits()) | u32::from(b.to_bits()) << 16;
            sb.extend(std::iter::repeat_n(word.to_le_bytes(), (st.rows * st.cols / 64) as usize).flatten());
        }
        // The input, then every output poisoned (a quiet NaN) until a form writes it.
        let mut act: Vec<u8> = std::iter::repeat_n(0x7fc0_deadu32.to_le_bytes(), layout.act_values).flatten().collect();
        for (i, v) in act[..4 * shapes[0].1 as usize].chunks_exact_mut(4).enumerate() {
            v.copy_from_slice(&((i % 7) as f32 * 0.25 - 0.75).to_le_bytes());
        }
        let bufs = [w, sb, act, vec![0u8; 4]];
        let bytes = (bufs[0].len() + bufs[1].len()) as f64;
        let n = layout.stages.len() as u32;
        let params = |first: u32, count: u32, prefetch: ChainPrefetch| {
            bytemuck::bytes_of(&chain_params(&layout, first, count, prefetch)).to_vec()
        };
        let mut first_act: Option<Vec<u8>> = None;
        for wg in [256u32, 512, 1024] {
            let kernel = Kernel::PersistentChain { xcap: 10240, pf, wg };
            let rb = wg / 16;
            let up = match h.upload_chain(kernel, &bufs) {
                Ok(up) => up,
                Err(e) => {
                    println!("| {name} | error: {e} | | | | | | | |");
                    continue;
                }
            };
            let per_stage = |wgs: Option<u32>| -> Vec<(Vec<u8>, (u32, u32, u32))> {
                layout
                    .stages
                    .iter()
                    .enumerate()
                    .map(|(i, st)| {
                        (
                            params(i as u32, 1, ChainPrefetch::After),
                            (wgs.map_or(st.rows / rb, |g| g.min(st.rows / rb)), 1, 1),
                        )
                    })
                    .collect()
            };
            let persistent = |prefetch: ChainPrefetch| vec![(params(0, n, prefetch), (132, 1, 1))];
            let forms: Vec<(&str, &str, Vec<(Vec<u8>, (u32, u32, u32))>)> = vec![
                ("one dispatch per stage", "rows / block", per_stage(None)),
                ("one dispatch per stage", "132", per_stage(Some(132))),
                ("persistent, loads after each barrier", "132", persistent(ChainPrefetch::After)),
                ("persistent, loads before each barrier", "132", persistent(ChainPrefetch::Before)),
                ("persistent, loads inside each barrier", "132", persistent(ChainPrefetch::Inside)),
            ];
            for (form, wgs, links) in forms {
                h.rewrite(&up, 2, &bufs[2]);
                let same = match h.run_chain(&up, &links, Step::default()) {
                    Ok(out) => match &first_act {
                        None => {
                            let finite = out[2]
                                .chunks_exact(4)
                                .all(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")).is_finite());
                            first_act = Some(out[2].clone());
                            if finite {
                                "(reference)".to_string()
                            } else {
                                "(reference, not all finite)".to_string()
                            }
                        }
                        Some(f) => {
                            if f == &out[2] {
                                "yes".to_string()
                            } else {
                                "NO".to_string()
                            }
                        }
                    },
                    Err(e) => format!("error: {e}"),
                };
                match h.time_chain(&up, &links, Step::default(), 3) {
                    Ok(us) => {
                        let gbs = bytes / us / 1e3;
                        println!("| {name} | {form} | {wg} × {wgs} | {us:.1} | {:.2} | {:.2} | {gbs:.0} | {:.1} % | {same} |", us / CHAIN_LAYERS as f64, us / n as f64, 100.0 * gbs / copy);
                    }
                    Err(e) => println!("| {name} | {form} | {wg} × {wgs} | error: {e} | | | | | {same} |"),
                }
            }
        }
    }
}
