//! Single-kernel benchmarks: GPU time of one dispatch (timestamps inside a pass, `reps` back to
//! back), the bytes it must read, the GB/s that implies, and the fraction of the copy
//! bandwidth this device reaches through the same API (the `copy` kernel on 1 GiB, or the
//! adapter's largest binding). On an NVIDIA machine, `tools/device/kbench.sh` runs it; anywhere:
//!
//! ```sh
//! cargo bench --bench kernels            # all shapes
//! cargo bench --bench kernels -- qmv     # only rows whose kernel label contains "qmv"
//! ```
//!
//! Every row whose kernel has a test case is that case (`tests/kernel_cases/`, the table the
//! kernel tests run) built at the row's shape with its inputs only (`Want::InputsOnly`: random
//! 4-bit codes with finite scales, uniform activations, no CPU reference) and timed as the case
//! launches it: the same buffers, params, step and grid the tests check on the same kernels.
//! The probes with no test case (the stream and layout tables' bare read, the copy ladder, the
//! grid barrier, the last-workgroup hand-off, the persistent chain, qkv_norm_rope's latency row)
//! build their own inputs.
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
//! router's top-k) as chains of dependent dispatches, next to a 16-byte copy: what each costs
//! inside a step beyond the barrier; a ladder under the norm (one workgroup's copies of 4 and 10
//! KiB, norms with only their sum) separates its memory rounds from its reductions.

// The shared case table (tests/kernel_cases/); the benchmarks use part of it.
#[path = "../tests/kernel_cases/mod.rs"]
mod kernel_cases;

use kernel_cases::attention::AttnCase;
use kernel_cases::matmul::MatmulCase;
use kernel_cases::moe::MoeMatmulCase;
use kernel_cases::norms::NormCase;
use kernel_cases::qmm::{GroupSumCase, SplitK};
use kernel_cases::small::RouterCase;
use kernel_cases::{seed_of, Case, Check, Dispatch, Launch, Rng, Want};
use kestrel::backend::wgpu::harness::{KernelHarness, Link};
use kestrel::kernels::{
    attention_chunk_coop, attention_short, attention_split, chain_layout, chain_params, qmm_shape, qmm_splits,
    qmv_moe_shape, qmv_shape, rmsnorm, AttnParams, BarrierParams, ChainPrefetch, CopyParams, Format, Kernel, QkvParams,
    Step, Tuning, ATTN_SPLITS, HEAD_NORM_WG, MATMUL_TOK, MATMUL_VERIFY_TOK, QMM_TOK,
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

/// Tokens of the prefill tables: one chunk (the backend's default).
const CHUNK: usize = 512;

/// `n` f32s of value `v`, as bytes (the probes' inputs: timing only).
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

/// `case` built for timing: its inputs only (no CPU reference), seeded by its name.
fn inputs(case: &impl Case) -> Launch {
    case.build(&mut Rng::new(seed_of(&case.name())), Want::InputsOnly)
}

/// Bytes of the launch's read-only buffers: what one dispatch must read at least.
fn input_bytes(l: &Launch) -> usize {
    l.bufs.iter().filter(|b| matches!(b.check, Check::Input)).map(|b| b.bytes.len()).sum()
}

/// GPU time of one dispatch of `d`, in µs ([`KernelHarness::time`]).
fn time(h: &mut KernelHarness, d: &Dispatch, reps: u32) -> kestrel::Result<f64> {
    h.time(d.kernel, &d.buffers, &d.params, d.step, d.grid, reps)
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
    matvec_table(&mut h, &filter, copy);
    prefill_table(&mut h, &filter);
    group_sum_table(&mut h, &filter);
    residual_norm_table(&mut h, &filter);
    experts_table(&mut h, &filter, copy);
    prefill_attention_table(&mut h, &filter);
    latency_table(&mut h, &filter);
    stream_table(&mut h, &filter, copy);
    layout_table(&mut h, &filter);
    persistent_chain_table(&mut h, &filter, copy);
}

/// The decode (1 token) and verify (4 tokens) mat-vec of every shape (`MatmulCase` with `qmv`),
/// the one-row-per-workgroup `matmul_q4_t1` beside them, the router's 8-bit `matmul_q8_t1`,
/// and with `--sweep` every lanes × rows-per-team form of the decode qmv (the data behind
/// `qmv_shape`'s rule).
fn matvec_table(h: &mut KernelHarness, filter: &str, copy: f64) {
    // µs (L2): one copy of the buffers, re-read by every dispatch (it stays in the 50 MB L2 when
    // it fits); µs (memory): dispatches cycle through copies of ≥ 256 MiB in all, so each reads
    // its weights from memory as a decode step does. GB/s and % from the latter.
    println!("| shape | rows × cols | kernel | µs (L2) | µs (memory) | GB read | GB/s | % of copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
    let max_binding = h.gpu().limits.max_storage_buffer_binding_size as usize;
    let sweep = std::env::args().any(|a| a == "--sweep");
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
        let case = |fmt, tile, qmv| MatmulCase { tile, qmv, ..MatmulCase::new(fmt, rows, cols, tile, 64) };
        // (case, a qmv form forced instead of qmv_shape's: the sweep's, with its rows a workgroup)
        let mut variants: Vec<(MatmulCase, Option<(Kernel, u32)>)> = Vec::new();
        for tok in [1, MATMUL_VERIFY_TOK as usize] {
            if qmv_shape(rows, cols, cols, tok as u32).is_some() {
                variants.push((case(Format::Q4, tok, true), None));
            }
        }
        variants.push((case(Format::Q4, 1, false), None));
        // The router's rows also as 8-bit (twice the bytes).
        if sh.name.contains("router") {
            variants.push((case(Format::Q8, 1, false), None));
        }
        if sweep && qmv_shape(rows, cols, cols, 1).is_some() {
            for lanes in [8u32, 16, 32, 64, 128] {
                for rpt in [1u32, 2, 4, 8] {
                    if (lanes as usize) <= cols / 32 * 2 {
                        let k = Kernel::Qmv { tok: 1, lanes, rpt, pro: 0, digits: false };
                        variants.push((case(Format::Q4, 1, true), Some((k, 128 / lanes * rpt))));
                    }
                }
            }
        }
        for (c, forced) in variants {
            let kernel = forced.map_or_else(|| c.kernel(), |f| f.0);
            let label = kernel.label();
            if !label.contains(filter) {
                continue;
            }
            let mut l = inputs(&c);
            if let Some((k, per_wg)) = forced {
                l.kernel = k;
                l.grid.0 = (rows as u32).div_ceil(per_wg);
            }
            l.fold_x(max_groups);
            let bytes = input_bytes(&l) as f64;
            let reps = if bytes > 1e8 { 20 } else { 200 };
            let copies = (ROTATE_BYTES / bytes as usize).clamp(1, 64);
            let d = l.into_dispatch();
            let timed = time(h, &d, reps).and_then(|warm| {
                h.time_cold(d.kernel, &d.buffers, &d.params, d.step, d.grid, reps, copies).map(|cold| (warm, cold))
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
}

/// Prefill: one 512-token chunk (the backend's default) through the tiled mat-mat (qmm, both
/// row tiles, the k loop whole or split into 2, 4, 8 ranges: the time is the split dispatch
/// plus its qmm_sum) and the 8-token matmul tile. `*` marks the variant the backend picks.
fn prefill_table(h: &mut KernelHarness, filter: &str) {
    let tokens = CHUNK;
    println!("\n| shape | rows × cols × tokens | kernel | k splits | µs | TFLOP/s | weight GB/s |");
    println!("|---|---|---|---|---|---|---|");
    let max_groups = h.gpu().limits.max_compute_workgroups_per_dimension;
    let coop = h.gpu().coop_f16();
    for sh in SHAPES.iter().filter(|s| s.rows < 65536 && s.rows * s.cols <= 64 << 20 && !s.name.contains("router")) {
        let (rows, cols) = (sh.rows, sh.cols);
        let picked = qmm_shape(rows, coop);
        let picked = (picked.0, qmm_splits(coop, rows, cols, tokens, picked.1, picked.2));
        let qmm = |tm, coop| MatmulCase {
            tile: QMM_TOK as usize,
            qmm: Some(tm),
            coop,
            ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64)
        };
        let mut forms = vec![qmm(8, None), qmm(4, None)];
        if coop {
            forms.extend([(1, 2), (2, 2), (1, 4), (2, 4)].map(|t| qmm(4, Some(t))));
        }
        forms.push(MatmulCase { tile: MATMUL_TOK as usize, ..MatmulCase::new(Format::Q4, rows, cols, tokens, 64) });
        for c in forms {
            let kernel = c.kernel();
            let label = kernel.label();
            if !label.contains(filter) {
                continue;
            }
            let mut l = inputs(&c);
            l.fold_x(max_groups);
            let weight_bytes: usize = l.bufs[..3].iter().map(|b| b.bytes.len()).sum();
            // The tensor-core form also reads x's group sums: their pass is part of its time.
            let sums = match c.coop {
                Some(_) => {
                    let g = GroupSumCase { tokens, cols, gs: 64, pad: 0, mult: 1, n_out: None };
                    Some(inputs(&g).into_dispatch())
                }
                None => None,
            };
            let splits: &[u32] = if c.qmm.is_some() { &[1, 2, 4, 8] } else { &[1] };
            for &splits in splits.iter().filter(|&&s| cols.is_multiple_of(64 * s as usize)) {
                let mut us = if splits > 1 {
                    let sk = SplitK::new(&c, &l, splits);
                    time(h, &sk.parts, 10).and_then(|a| time(h, &sk.sum, 10).map(|b| a + b))
                } else {
                    h.time(l.kernel, &l.buffers(), &l.params, l.step, l.grid, 10)
                };
                if let Some(s) = &sums {
                    us = us.and_then(|a| time(h, s, 10).map(|b| a + b));
                }
                let mark = if (kernel, splits) == picked { " *" } else { "" };
                match us {
                    Ok(us) => {
                        let flops = 2.0 * (rows * cols * tokens) as f64;
                        println!(
                            "| {} | {rows} × {cols} × {tokens} | {label}{mark} | {splits} | {us:.1} | {:.2} | {:.0} |",
                            sh.name,
                            flops / us / 1e6,
                            weight_bytes as f64 / us / 1e3
                        );
                    }
                    Err(e) => {
                        println!("| {} | {rows} × {cols} × {tokens} | {label} | {splits} | error: {e} | | |", sh.name)
                    }
                }
            }
        }
    }
}

/// x's group sums for the tensor-core mat-mats (group_sum.wgsl), one 512-token chunk.
fn group_sum_table(h: &mut KernelHarness, filter: &str) {
    let tokens = CHUNK;
    println!("\n| x of a 512-token chunk | cols | kernel | µs | GB/s |");
    println!("|---|---|---|---|---|");
    for cols in [1536usize, 2560, 6144, 10240] {
        let c = GroupSumCase { tokens, cols, gs: 64, pad: 0, mult: 1, n_out: None };
        let label = c.kernel().label();
        if !label.contains(filter) {
            continue;
        }
        let d = inputs(&c).into_dispatch();
        let moved: usize = d.buffers.iter().map(Vec::len).sum();
        match time(h, &d, 10) {
            Ok(us) => println!("| {tokens} × {cols} | {cols} | {label} | {us:.1} | {:.0} |", moved as f64 / us / 1e3),
            Err(e) => println!("| {tokens} × {cols} | {cols} | {label} | error: {e} | |"),
        }
    }
}

/// The chunk's residual norms, one 512-token chunk (E2B / E4B / 26B widths, mode 2 with its
/// chained input norm; the 26B's with its three): rmsnorm.wgsl's decode form, and
/// rmsnorm_rows.wgsl's chunk form on 64, 128 and 256 threads per row, without and with the
/// chained outputs' group sums (what group_sum's dispatch per mat-mat input costs above).
fn residual_norm_table(h: &mut KernelHarness, filter: &str) {
    let tokens = CHUNK;
    println!("\n| residual norm of a 512-token chunk | chained | kernel | µs | GB/s |");
    println!("|---|---|---|---|---|");
    let max_wg = h.gpu().limits.max_compute_invocations_per_workgroup;
    for (n, chain) in [(1536usize, 1usize), (2560, 0), (2560, 1), (2816, 3)] {
        let norm = NormCase { chain: (chain > 0).then_some(0), chained: chain.max(1), ..NormCase::new(n, tokens, 2) };
        let Kernel::RmsNorm { wg, .. } = rmsnorm(n, max_wg, &Tuning::default()) else {
            unreachable!("rmsnorm() is a norm")
        };
        let forms = [NormCase { wg, ..norm }].into_iter().chain([64, 128, 256].into_iter().flat_map(|wg| {
            [None, Some(64)].map(|sums| NormCase { rows: Some(wg), sums, sums_chained_only: true, ..norm })
        }));
        // x and the residual read, out and each chained output written.
        let moved = (4 * tokens * n * (3 + chain)) as f64;
        for c in forms {
            let label = c.kernel().label();
            if !label.contains(filter) {
                continue;
            }
            match time(h, &inputs(&c).into_dispatch(), 10) {
                Ok(us) => println!("| {tokens} × {n} | {chain} | {label} | {us:.1} | {:.0} |", moved / us / 1e3),
                Err(e) => println!("| {tokens} × {n} | {chain} | {label} | error: {e} | |"),
            }
        }
    }
}

/// Routed experts, one decode token (26B-A4B: 128 experts, top 8): the fused gate_up's gate
/// half (704 rows of a 1408-row expert, 2816 cols) and down (2816 rows × 704), through the
/// 4-bit decode kernel the backend picks (qmv_moe) and the per-pair kernel it replaced.
fn experts_table(h: &mut KernelHarness, filter: &str, copy: f64) {
    println!(
        "\n| 26B experts (top 8 of 128, 1 token) | rows × cols per expert | kernel | µs | GB read | GB/s | % of copy |"
    );
    println!("|---|---|---|---|---|---|---|");
    let max_binding = h.gpu().limits.max_storage_buffer_binding_size as usize;
    let (experts, top_k) = (128usize, 8usize);
    let m = |rows, cols| MoeMatmulCase::new(Format::Q4, experts, top_k, rows, cols, 1);
    for (name, c) in [
        ("gate (fused gate_up)", MoeMatmulCase { expert_stride: 2 * 704, ..m(704, 2816) }),
        ("down", MoeMatmulCase { per_slot: true, ..m(2816, 704) }),
    ] {
        let (rows, cols) = (c.rows, c.cols);
        if experts * c.expert_stride * cols / 2 > max_binding {
            println!("| {name} | {rows} × {cols} | skipped: the expert stack exceeds one binding here | | | | |");
            continue;
        }
        // Bytes one token reads: its 8 experts' rows, scales and biases.
        let bytes = (top_k * rows * (cols / 2 + 2 * 2 * cols / 64)) as f64;
        let (x_tok, x_slot) = c.x_strides();
        let mut variants = vec![c];
        if qmv_moe_shape(rows, cols, top_k, x_tok, x_slot, &Tuning::default()).is_some() {
            variants.insert(0, MoeMatmulCase { qmv: true, ..c });
        }
        for c in variants {
            let label = c.kernel().label();
            if !label.contains(filter) {
                continue;
            }
            match time(h, &inputs(&c).into_dispatch(), 100) {
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
    // The decode mat-vecs: the mat-vec table's cases (1 token), their weights' bytes.
    for name in ["E4B q|k|v", "E4B down", "E4B gate|up", "E2B q|k|v", "E2B down", "E2B gate|up"] {
        let sh = SHAPES.iter().find(|s| s.name == name).expect("a SHAPES entry");
        let (rows, cols) = (sh.rows, sh.cols);
        if qmv_shape(rows, cols, cols, 1).is_none() {
            continue;
        }
        let mut l = inputs(&MatmulCase { tile: 1, qmv: true, ..MatmulCase::new(Format::Q4, rows, cols, 1, 64) });
        l.fold_x(max_groups);
        let bytes = l.bufs[..3].iter().map(|b| b.bytes.len()).sum();
        let d = l.into_dispatch();
        row(h, name, bytes, d.kernel, &d.buffers, &d.params, d.step, d.grid);
    }
}

/// Prefill attention (attention.wgsl, and attention_coop.wgsl where the device has tensor cores)
/// over one 512-token chunk from position 0, at E2B's heads (8 query heads on 1 kv head; d 256
/// with the 512-key window, d 512 full) and E4B's (8 on 2): GPU time per dispatch and the
/// TFLOP/s of the causal products it must do (2 · 2 · d flops per attended (query, key) pair
/// per head).
fn prefill_attention_table(h: &mut KernelHarness, filter: &str) {
    let tokens = CHUNK;
    println!("\n| prefill attention | heads (q / kv) × d, window | tokens | kernel | µs | TFLOP/s |");
    println!("|---|---|---|---|---|---|");
    let shapes = [
        ("E2B sliding", 8usize, 1usize, 256usize, 512usize),
        ("E2B full", 8, 1, 512, 0),
        ("E4B sliding", 8, 2, 256, 512),
        ("E4B full", 8, 2, 512, 0),
    ];
    let coop = h.gpu().coop_f16();
    for (name, n_q, n_kv, d, window) in shapes {
        let c = AttnCase::new(d, n_q, n_kv, tokens, 0, window, 1024);
        // The SIMT kernel, then the tensor-core form and the one that also writes its output's
        // group sums (KESTREL_ATTN_SUMS).
        let mut forms = vec![c];
        if coop && attention_chunk_coop(d).is_some() {
            forms.extend([false, true].map(|sums| AttnCase { coop: true, sums, ..c }));
        }
        let pairs: usize = (0..tokens).map(|t| if window > 0 { (t + 1).min(window) } else { t + 1 }).sum();
        let flops = (4 * d * pairs * n_q) as f64;
        for c in forms {
            let label = c.kernel().label();
            if !label.contains(filter) {
                continue;
            }
            match time(h, &inputs(&c).into_dispatch(), 20) {
                Ok(us) => println!(
                    "| {name} | {n_q} / {n_kv} × {d}, {window} | {tokens} | {label} | {us:.1} | {:.2} |",
                    flops / us / 1e6
                ),
                Err(e) => println!("| {name} | {n_q} / {n_kv} × {d} | {tokens} | {label} | error: {e} | |"),
            }
        }
    }
}

/// One grid-wide barrier (fence, atomic arrival, spin, fence: grid_barrier.wgsl) among 132, 264
/// and 528 workgroups (1, 2, 4 per H200 SM: all resident), each dispatch 1000 of them: what a
/// persistent decode kernel would pay between phases, against the dependent dispatch (the copy
/// row) it would replace. A run first counts the reads that saw stale data (on the H200 most
/// did, ledger: 2026-11-30 grid-barrier-probe: such a barrier orders atomics only, not plain
/// stores); the atomic form hands the slots over as atomics (ledger: 2026-12-02
/// last-workgroup-handoff), the hand-off a WGSL "last workgroup" fusion needs. Only on a device
/// with ≥ 132 SMs' worth of concurrent workgroups: elsewhere the grid would not be resident at
/// once and the kernel would spin forever.
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
    let Kernel::RmsNorm { wg: norm_wg, .. } = rmsnorm(1536, max_wg, &Tuning::default()) else {
        unreachable!("rmsnorm() is a norm")
    };
    let row = |h: &mut KernelHarness, d: &Dispatch, shape: String| {
        let label = d.kernel.label();
        if !label.contains(filter) {
            return;
        }
        match time(h, d, 200) {
            Ok(us) => println!("| {label} | {shape} | {us:.2} |"),
            Err(e) => println!("| {label} | {shape} | error: {e} |"),
        }
    };
    let copy = |vec4s: usize, grid: (u32, u32, u32)| Dispatch {
        kernel: Kernel::Copy,
        buffers: vec![f32s(4 * vec4s, 1.0), f32s(4 * vec4s, 0.0)],
        params: bytemuck::bytes_of(&CopyParams { n: vec4s as u32, ..Default::default() }).to_vec(),
        step,
        grid,
    };
    row(h, &copy(1, (1, 1, 1)), "16 bytes".into());
    // The ladder under a one-workgroup norm (ledger: 2026-12-01 latency-ladder): one load and
    // store per thread of one workgroup (4 KiB), three in turn (10 KiB: 2560 floats), the same
    // bytes over 3 workgroups.
    for (vec4s, wgs) in [(256usize, 1u32), (640, 1), (640, 3)] {
        row(h, &copy(vec4s, (wgs, 1, 1)), format!("{} KiB, {wgs} workgroup(s)", vec4s * 16 / 1024));
    }
    grid_barrier_rows(h, filter);
    last_workgroup_rows(h, filter);
    // Then a norm with only the sum: 1 value per thread, then 6, no weight and no residual
    // (mode 0), then with its weight.
    for (n, weight) in [(256usize, false), (1536, false), (1536, true)] {
        let c = NormCase { weight, wg: norm_wg, ..NormCase::new(n, 1, 0) };
        let what = if weight { "weight" } else { "no weight" };
        if c.kernel().label().contains(filter) {
            row(h, &inputs(&c).into_dispatch(), format!("n {n}, mode 0, {what}"));
        }
    }
    // rmsnorm: a residual post-norm (mode 1) with 0, 1 and 3 chained norms, E2B/E4B/26B widths.
    for n in [1536usize, 2560, 2816] {
        for chain in [0usize, 1, 3] {
            let c = NormCase {
                chain: (chain > 0).then_some(0),
                chained: chain.max(1),
                wg: norm_wg,
                ..NormCase::new(n, 1, 1)
            };
            if c.kernel().label().contains(filter) {
                row(h, &inputs(&c).into_dispatch(), format!("n {n}, chain {chain}"));
            }
        }
    }
    // q, k, v heads of one token (E2B sliding: 8 + 1 + 1 heads of 256; full: of 512). No case
    // of its own: its test holds it bitwise to three head_norm_rope cases.
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
        let buffers = vec![
            f32s(stride, 0.3),
            f32s(2 * d, 1.0),
            f32s(d, 0.5),
            f32s(n_q * d, 0.0),
            f32s(slots * n_kv * d, 0.0),
            f32s(slots * n_kv * d, 0.0),
        ];
        for wg in [HEAD_NORM_WG, 128, 64].into_iter().filter(|&wg| d <= 4 * wg as usize) {
            let qkv = Dispatch {
                kernel: Kernel::QkvNormRope { wg },
                buffers: buffers.clone(),
                params: bytemuck::bytes_of(&p).to_vec(),
                step,
                grid: ((n_q + 2 * n_kv) as u32, 1, 1),
            };
            row(h, &qkv, format!("8 + 1 + 1 heads × {d}"));
        }
    }
    // Decode attention at E2B's sliding heads (8 q heads on 1 kv head, d 256) over 131 keys,
    // and at 1025 and 4097 keys: the split kernel, then the merge (on AttnCase's one-token row
    // at position keys − 1: its q, caches and output). Then the split kernel with one split at
    // 32–256 keys: what a one-pass attention without the merge dispatch would cost at short
    // contexts (the question attention_short answered: ledger: 2026-12-03 attention-short).
    let (heads, slots) = (8usize, 4608usize);
    for (keys, splits) in
        [(131usize, ATTN_SPLITS), (1025, ATTN_SPLITS), (4097, ATTN_SPLITS), (32, 1), (131, 1), (256, 1)]
    {
        let d = 256;
        let wanted = attention_split(d, false).label().contains(filter)
            || (splits > 1 && Kernel::AttentionCombine.label().contains(filter));
        if !wanted {
            continue;
        }
        let l = inputs(&AttnCase::new(d, heads, 1, 1, keys - 1, 0, slots));
        let [split, combine] = split_attention(&l, heads, d, &AttnParams { n_splits: splits, ..l.params_as() });
        row(h, &split, format!("{keys} keys in {splits} split(s), 8 heads × {d}"));
        if splits > 1 {
            row(h, &combine, format!("{keys} keys in {splits} splits, 8 heads × {d}"));
        }
    }
    // attention_short (one dispatch per (head, token), every key) against attention_split +
    // attention_combine (two) at the same rows: 16–1025 keys at E2B's sliding heads (d 256),
    // 144 and 512 at its global ones (d 512), 8 q heads on 1 kv head. Which is cheaper by key
    // count sets WgpuOptions::attn_short (ledger: 2026-12-03 attention-short).
    let limits = h.gpu().device_limits();
    for (d, keys) in
        [(256usize, 16usize), (256, 64), (256, 144), (256, 256), (256, 512), (256, 1025), (512, 144), (512, 512)]
    {
        let short_kernel = attention_short(d, false, &limits);
        let wanted = [short_kernel, attention_split(d, false), Kernel::AttentionCombine]
            .iter()
            .any(|k| k.label().contains(filter));
        if !wanted {
            continue;
        }
        let l = inputs(&AttnCase::new(d, heads, 1, 1, keys - 1, 0, slots));
        let long = AttnParams { n_splits: ATTN_SPLITS, ..l.params_as() };
        let short = Dispatch {
            kernel: short_kernel,
            buffers: l.buffers(),
            params: bytemuck::bytes_of(&AttnParams { short_max: u32::MAX, ..long }).to_vec(),
            step: l.step,
            grid: (heads as u32, 1, 1),
        };
        let [split, combine] = split_attention(&l, heads, d, &long);
        row(h, &short, format!("{keys} keys, 8 heads × {d}"));
        let shape = format!("{keys} keys, 8 heads × {d} in {ATTN_SPLITS} splits");
        row(h, &split, shape.clone());
        row(h, &combine, shape);
    }
    // The 26B router: top 8 of 128 experts.
    let c = RouterCase::new(128, 8, 1);
    if c.kernel().label().contains(filter) {
        row(h, &inputs(&c).into_dispatch(), "top 8 of 128".into());
    }
}

/// Decode attention over case launch `l` (one token of `heads` heads × `d`; its q, caches and
/// output): attention_split over `p.n_splits` key splits into their partials, then
/// attention_combine merging them into o.
fn split_attention(l: &Launch, heads: usize, d: usize, p: &AttnParams) -> [Dispatch; 2] {
    let part = filled_f32s(heads * p.n_splits as usize * (d + 2), 0.0);
    let params = bytemuck::bytes_of(p).to_vec();
    let q_k_v = l.bufs[..3].iter().map(|b| b.bytes.clone());
    [
        Dispatch {
            kernel: attention_split(d, false),
            buffers: q_k_v.chain([part.clone()]).collect(),
            params: params.clone(),
            step: l.step,
            grid: (heads as u32, p.n_splits, 1),
        },
        Dispatch {
            kernel: Kernel::AttentionCombine,
            buffers: vec![part, l.bufs[3].bytes.clone()],
            params,
            step: l.step,
            grid: (heads as u32, 1, 1),
        },
    ]
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
/// once. 264 workgroups of 256 threads were found not resident at once (the dispatch spun until
/// killed; ledger: 2026-12-02 persistent-chain): one workgroup per SM is what every form here
/// uses.
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
            let per_stage = |wgs: Option<u32>| -> Vec<Link> {
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
            let forms: Vec<(&str, &str, Vec<Link>)> = vec![
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
