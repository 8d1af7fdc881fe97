//! The shape policy: which form of a kernel family runs a given matrix, row or head, and with
//! what tile — pure functions of the shape, the device's limits ([`DeviceLimits`]) and the
//! [`Tuning`]. Every backend asks these, so their programs pick the same forms (and so the
//! same reduction orders: what keeps a verify row bitwise a decode row), and the tile constants
//! the kernel sources substitute are defined here, next to the rule that picks them. Each rule's
//! doc gives the measurement it was fitted to.

use super::{Format, Kernel, NormParams, Tuning, WideFuse, NO_WEIGHT};

/// What the shape rules need to know of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Invocations one workgroup may have.
    pub max_threads: u32,
    /// Largest workgroup size along x.
    pub max_workgroup_x: u32,
    /// Bytes of workgroup memory one workgroup may use.
    pub max_workgroup_bytes: u32,
}

/// Splits a 1-D workgroup count `x` into `(x', z)` with `x' ≤ max` and `x'·z ≥ x`, for kernels
/// that linearise `wid.x + wid.z · num_workgroups.x` (matmul, embed). WebGPU caps each grid
/// dimension at 65535 workgroups; the E2B LM head alone needs 65536.
pub fn fold_grid(x: u32, max: u32) -> (u32, u32) {
    if x <= max {
        (x, 1)
    } else {
        let z = x.div_ceil(max);
        (x.div_ceil(z), z)
    }
}

/// Rows one `moe_matmul` workgroup covers (`ROWS` in moe_matmul.wgsl), and the token tile of
/// the prefill `matmul` variant (the decode variant has a tile of 1).
pub const MATMUL_ROWS: u32 = 4;

pub const MATMUL_TOK: u32 = 8;

/// The token tile of the speculative-verify `matmul` variant (M = k + 1 ≤ 5 typically).
pub const MATMUL_VERIFY_TOK: u32 = 4;

/// Rows one `matmul` workgroup covers for a token tile of `tok` (`ROWS` in matmul.wgsl): one
/// row per workgroup for the decode mat-vec and the verify tile (most workgroups; measured
/// fastest on the H200, ledger: 2026-11-29 matvec-rows-1), four when 8 prefill tokens share
/// each weight load.
pub const fn matmul_rows(tok: u32) -> u32 {
    if tok == 1 || tok == MATMUL_VERIFY_TOK {
        1
    } else {
        4
    }
}

/// Threads of one `qmv` workgroup (`WG` in qmv.wgsl).
pub const QMV_WG: u32 = 128;

/// The `qmv` variant for a `rows × cols` 4-bit matrix and a token tile of `tok`, and its rows per
/// workgroup; `None` where qmv does not apply (cols not whole 64-value groups, or an x stride
/// that is not whole vec4s). Lanes per row follow the matrix shape only, so every token tile of
/// a matrix (decode, verify) reduces a row the same way: bitwise-identical rows.
///
/// The rule is the H200 sweep of `cargo bench --bench kernels -- --sweep` on the warmed harness
/// and the decode steps' per-kernel times (ledger: 2026-11-30 qmv-stage-rule, 2026-11-30
/// qmv-stage-rule-refined), with x staged in workgroup
/// memory where lanes ≤ 32 and x takes several rounds ([`qmv_staged`]): tall matrices (≥ 12288
/// rows: the stacked gate|up of E2B and E4B; 26B's 8192-row q|k|v was slower so) take 16 lanes ×
/// 2 rows per team, and 16 × 8 where their rows are long (≥ 16384 values: 16 or more staging
/// rounds, each round's x digits then serve 64 rows; the 256 MiB matrix 132.2 → 99.9 µs, ledger:
/// 2026-12-01 qmv-sweep-integer; no matrix of the three models is that long), the LM head
/// (≥ 65536 rows) 8 × 4 (the sweep with the weights read from memory: E2B 117.7 → 104.0 µs, E4B
/// 183.7 → 170.8, ledger: 2026-11-30 lm-head-8x4; still the best with the integer loop, ledger:
/// 2026-12-01 qmv-sweep-integer); the rest about two 32-value chunks
/// per lane (lanes = the power of two ≥ chunks / 2, at most `QMV_MAX_LANES`), four rows per
/// team while that still leaves ≥ 256 workgroups (2 per SM), fewer otherwise.
pub fn qmv_shape(rows: usize, cols: usize, x_stride: usize, tok: u32) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_dense_tile(rows, cols);
    Some((Kernel::Qmv { tok, lanes, rpt, pro: 0, digits: false }, QMV_WG / lanes * rpt))
}

/// Lanes per row and rows per team of the dense qmv rule (see [`qmv_shape`]).
fn qmv_dense_tile(rows: usize, cols: usize) -> (u32, u32) {
    match (rows, cols) {
        (65536.., _) => (8, 4),
        (12288.., 16384..) => (16, 8),
        (12288.., _) => (16, 2),
        _ => qmv_tile(rows, cols),
    }
}

/// Lanes per row and rows per team of the general rule (the routed experts' rule, whose loop
/// is not staged) for `rows` rows spread over the grid.
fn qmv_tile(rows: usize, cols: usize) -> (u32, u32) {
    let lanes = ((cols / 32) as u32).div_ceil(2).next_power_of_two().clamp(8, QMV_MAX_LANES);
    let teams = (QMV_WG / lanes) as usize;
    let rpt = [4u32, 2].into_iter().find(|&r| rows.div_ceil(teams * r as usize) >= 256).unwrap_or(1);
    (lanes, rpt)
}

/// The general rule's lanes per row at most one subgroup of 32 (on NVIDIA: a row's sum without a
/// reduction across warps), so dense rows of more than 64 chunks take the staged loop. Measured on the H200 with the clock held up
/// (ledger: 2026-12-02 qmv-max-lanes-32, 2026-12-02 qmv-qkv-32x2): kbench's E4B q|k|v 9.17 µs at
/// 64 lanes × 4 rows, 7.87 at 32 × 2; decode, alternating with the 128-lane rule, E2B 350.0 →
/// 358.4, E4B 213.2 → 232.6, 26B 253.7 → 258.2 tok/s.
const QMV_MAX_LANES: u32 = 32;

/// The `qmv_glu` variant for a stacked [gate; up] matrix of `2 · rows` rows × `cols` and a
/// token tile of `tok`, and its output rows per workgroup; `None` where qmv does not apply.
/// Lanes and rows per team follow qmv's rule for the stacked matrix (at least one gate/up pair
/// per team), so rows reduce as qmv would reduce them.
pub fn qmv_glu_shape(rows: usize, cols: usize, x_stride: usize, tok: u32, t: &Tuning) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_stride.is_multiple_of(4) {
        return None;
    }
    // Tall stacks of the widths whose GeGLU takes the fused-norm prologue (E2B's 1536) get two
    // pairs per team: half the workgroups, so half the redundant prologues. Measured on the
    // H100 with the integer-digit loop (ledger: 2026-12-05 glu-16x2-digits): E2B 391.4 / 390.7 →
    // 394.7 / 402.0 tok/s, the GeGLU's timestamped 22.9 → 21.9 µs a dispatch; at 8 lanes × 2
    // pairs 392.4 / 391.7. On the float loop it gained nothing (26.7 µs), so `qmv_digits=off`
    // keeps the old tile (that setting then gives the float-loop kernels whole, as they ran
    // before ledger: 2026-12-05 qmv-digits-fused-norm). The rule assumes these widths are fused,
    // as they are by default (`PRO_MAX_HIDDEN`); `fuse_norms_up_to=0` leaves them unfused on it.
    let wide_fused = t.qmv_digits && 2 * rows >= 12288 && cols <= PRO_MAX_HIDDEN;
    let (lanes, rpt) = if wide_fused { (16, 4) } else { qmv_dense_tile(2 * rows, cols) };
    let pairs = (rpt / 2).max(1);
    Some((Kernel::QmvGlu { tok, lanes, pairs, pro: 0, digits: false }, QMV_WG / lanes * pairs))
}

/// The gated qmv (`y = gelu_tanh(W x) · gb[..]`) for `rows` × `cols` at token tile `tok`, and
/// its rows per workgroup: the plain rule's tile.
pub fn qmv_gelu_b_shape(rows: usize, cols: usize, x_stride: usize, tok: u32) -> Option<(Kernel, u32)> {
    match qmv_shape(rows, cols, x_stride, tok)? {
        (Kernel::Qmv { tok, lanes, rpt, .. }, per_wg) => {
            Some((Kernel::QmvGeluB { tok, lanes, rpt, pro: 0, digits: false }, per_wg))
        }
        _ => None,
    }
}

/// Bytes of x one round of the staged qmv may hold in workgroup memory (with `red`, within the
/// 32 KiB of lavapipe and the 48 KiB of the H200).
const QMV_STAGE_BYTES: u32 = 16384;

/// Whether a qmv tile may stage x in workgroup memory (qmv_core.wgsl's `qmv_dots_staged`, taken
/// for rows of more than two chunks per lane): where four or more teams share a workgroup (each
/// would read x itself) and a round of x fits `QMV_STAGE_BYTES` — for lanes ≤ 32 always, at
/// decode's CU 2 and verify's 4 tokens, so the decode and verify tiles of a matrix take the same
/// loop (their rows are bitwise equal: tested).
pub fn qmv_staged(tok: u32, lanes: u32, cu: u32) -> bool {
    lanes <= QMV_STAGE_LANES && tok * lanes * cu * 32 * 4 <= QMV_STAGE_BYTES
}

/// The widest team that stages x: at 64 lanes (two teams) a round's 16 KiB of x and its barriers
/// cost more than the halved x reads save (E4B gate|up 25.0 → 33.8 µs staged; ledger: 2026-11-30
/// qmv-stage-x).
const QMV_STAGE_LANES: u32 = 32;

/// The `qmv_moe` variant for 4-bit experts of `rows` rows (per expert) × `cols`, routed
/// `top_k` per token, and its rows per workgroup; `None` where it does not apply (as
/// [`qmv_shape`], with both x strides in whole vec4s). Shaped by the general qmv rule for the
/// `rows · top_k` rows one token's pairs cover (never the LM-head rule: experts are narrow).
pub fn qmv_moe_shape(
    rows: usize,
    cols: usize,
    top_k: usize,
    x_tok_stride: usize,
    x_slot_stride: usize,
    t: &Tuning,
) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_tok_stride.is_multiple_of(4) || !x_slot_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_tile(rows * top_k, cols);
    Some((Kernel::QmvMoe { lanes, rpt, n4: qmv_moe_n4(cols, rpt, t) }, QMV_WG / lanes * rpt))
}

/// The `qmv_moe_glu` variant for fused gate_up experts of `rows` gate (and `rows` up) rows ×
/// `cols`, and its output rows per workgroup; `None` where qmv_moe does not apply. Shaped by the
/// qmv rule for the `2 · rows · top_k` rows one token's pairs cover, at least one pair per team.
pub fn qmv_moe_glu_shape(
    rows: usize,
    cols: usize,
    top_k: usize,
    x_tok_stride: usize,
    x_slot_stride: usize,
    t: &Tuning,
) -> Option<(Kernel, u32)> {
    if !cols.is_multiple_of(64) || !x_tok_stride.is_multiple_of(4) || !x_slot_stride.is_multiple_of(4) {
        return None;
    }
    let (lanes, rpt) = qmv_tile(2 * rows * top_k, cols);
    let pairs = (rpt / 2).max(1);
    Some((Kernel::QmvMoeGlu { lanes, pairs, n4: qmv_moe_n4(cols, 2 * pairs, t) }, QMV_WG / lanes * pairs))
}

/// The x row length (in vec4s) a routed-expert mat-vec of `cols` and `rpt` rows per team stages
/// as digits, 0 for the float loop: with [`Tuning::qmv_digits`], where the digits (16 bytes per 4
/// values) and `red` fit [`WG_MEMORY_MIN`], so no device's limit needs asking (the 26B's
/// 2816-wide gate_up rows: 11 KiB + 2 KiB).
fn qmv_moe_n4(cols: usize, rpt: u32, t: &Tuning) -> u32 {
    let bytes = 4 * cols + 4 * (rpt * QMV_WG) as usize;
    if t.qmv_digits && bytes <= WG_MEMORY_MIN {
        (cols / 4) as u32
    } else {
        0
    }
}

/// Workgroup memory every WebGPU device offers (maxComputeWorkgroupStorageSize's minimum).
const WG_MEMORY_MIN: usize = 16384;

/// The widest residual stream whose norms every kind of decode mat-vec takes over (`fuse_norm`
/// in mod.rs; past it, the kinds [`fuse_norm_into`] names). Measured on the H200 (ledger:
/// 2026-11-30 fuse-norms-2048, 2026-11-30 fused-norm-kv-shared-q; same binary, fused vs
/// `fuse_norms_up_to=0` / `all`): E2B (1536) 306 → 339 tok/s, but E4B (2560) 207 → 198 and
/// 26B (2816) 202 → 184. The prologue's cost follows the bytes every workgroup reads again
/// (the norm's input, the residual and the weights: 40–45 KB per workgroup there, against 24 KB
/// at 1536); at 2560 no consumer kind gains alone (q|k|v 200, gate|up 191, per-layer gate 205:
/// ledger: 2026-11-30 fused-norm-one-kind), and neither a three-pass prologue nor tiles of more
/// rows per workgroup closed the gap (ledger: 2026-11-30 fused-norm-lean, 2026-11-30
/// fused-norm-tall-tiles). With 32-lane teams the per-layer gate alone does (ledger: 2026-12-03
/// fuse-wide-gated; [`fuse_norm_into`]).
pub const PRO_MAX_HIDDEN: usize = 2048;

/// Whether a residual norm of width `h` moves into the decode mat-vec `consumer`: every kind up
/// to `up_to` (0: none), and past it the kinds `wide` names. Measured on the H200 with today's
/// 32-lane teams (E4B at 2560, -p 16 -n 128; ledger: 2026-12-02 fuse-norms-max-wg, 2026-12-02
/// fuse-wide-gated-glu, 2026-12-03 fuse-wide-gated): the width rule 229.3 / 229.4
/// (fuse-norms-max-wg) and 229.8 / 229.4 (fuse-wide-gated-glu) tok/s; into the gated per-layer
/// gate (64 workgroups) 235.7 (fuse-norms-max-wg, one run; 235.8 / 235.4 against the width
/// rule's 229.6 / 228.9 in fuse-wide-gated: the default); the gate and q|k|v (256–384) 222.3
/// (fuse-norms-max-wg); the gate and the GeGLU (1280) 231.7 / 231.8 (fuse-wide-gated-glu); all
/// three 230.9 (fuse-norms-max-wg); the 26B's q|k|v (its only fusable consumer) 255.8 → 244.3.
/// Why the GeGLU and q|k|v take back what the gate gains is not known (all read the same 40 KB
/// prologue per workgroup).
pub fn fuse_norm_into(consumer: Kernel, h: usize, up_to: usize, wide: WideFuse) -> bool {
    up_to > 0
        && (h <= up_to
            || match consumer {
                Kernel::QmvGeluB { .. } => wide != WideFuse::None,
                Kernel::QmvGlu { .. } => wide == WideFuse::GatedGlu,
                _ => false,
            })
}

/// Token tile of the fused-norm qmv's verify form: the tile's inputs live in workgroup memory
/// (4 bytes × cols per token), so the tile is smaller than [`MATMUL_VERIFY_TOK`]. Widening it to
/// the most that fits lost on an H100 (E2B verify of 4 tokens 5.34 → 6.52 ms, E4B 8.50 → 8.97:
/// one 4-token tile of these workgroup-memory-heavy kernels against two 2-token ones;
/// ledger: 2026-12-06 verify-fused-tile-wide).
pub const PRO_VERIFY_TOK: u32 = 2;

/// The fused-norm form of a qmv variant (same lanes and rows per team, so the same rows) at
/// token tile `tok`, over rows of `cols` values, where the tile's inputs fit in workgroup
/// memory beside the reduction's (`None` elsewhere, and for other kernels). The prologue stages
/// x as integer digits with [`Tuning::qmv_digits`].
pub fn with_norm(kernel: Kernel, tok: u32, cols: usize, max_wg_bytes: u32, t: &Tuning) -> Option<Kernel> {
    let pro = (cols / 4) as u32;
    let digits = t.qmv_digits;
    let (fused, rpt) = match kernel {
        Kernel::Qmv { lanes, rpt, .. } => (Kernel::Qmv { tok, lanes, rpt, pro, digits }, rpt),
        Kernel::QmvGlu { lanes, pairs, .. } => (Kernel::QmvGlu { tok, lanes, pairs, pro, digits }, 2 * pairs),
        Kernel::QmvGeluB { lanes, rpt, .. } => (Kernel::QmvGeluB { tok, lanes, rpt, pro, digits }, rpt),
        _ => return None,
    };
    let bytes = 16 * tok * pro + 4 * rpt * tok * QMV_WG;
    (cols.is_multiple_of(64) && bytes <= max_wg_bytes).then_some(fused)
}

/// Tokens of one `qmm` workgroup (`BN` in qmm.wgsl).
pub const QMM_TOK: u32 = 64;

/// The `qmm` variant for a matrix of `rows` rows, and its rows per workgroup (16 · TM). 4 rows
/// per thread everywhere: on the H200 the 128-row tile (TM 8: 128 multiply-adds per 12
/// workgroup-memory reads instead of 64 per 8) was no faster on any Gemma 4 shape and slower on
/// most (ledger: 2026-11-30 qmm-rule; a sweep taken before the harness warmed the GPU's clock,
/// ledger: 2026-11-30 clock-ramp, to be re-measured — TM 8 stays a kernel variant, in kbench and
/// the tests, for that).
/// `coop`: the device runs f16 cooperative matrices and the caller wants them: then `qmm_coop`
/// (tensor cores; ledger: 2026-11-30 qmm-coop). Returns the kernel, its rows and its tokens per
/// workgroup.
pub fn qmm_shape(_rows: usize, coop: bool) -> (Kernel, u32, u32) {
    if !coop {
        return (Kernel::Qmm { tm: 4 }, 64, QMM_TOK);
    }
    // 128 rows × 128 tokens: each weight's dequantisation and each x value's split serve twice
    // the products of 64 × 64 (E4B pp512 4156 → 6313 tok/s, ledger: 2026-11-30 qmm-coop). The
    // other tiles qmm_coop_core.wgsl's staging divides evenly (TB 1 or 2, RB 2 or 4) stay
    // kernel variants, in the kernel tests and benches.
    let (tb, rb) = (2, 4);
    (Kernel::QmmCoop { tb, rb }, 32 * rb, 64 * tb)
}

/// The GeGLU form of `qmm_coop` (`QmmCoopGlu`) for a stacked [gate; up] matrix, its gate rows
/// and its tokens per workgroup: 128 tokens, as qmm_coop's tile.
pub fn qmm_coop_glu_shape() -> (Kernel, u32, u32) {
    let tb = 2;
    (Kernel::QmmCoopGlu { tb }, 64, 64 * tb)
}

/// The prefill kernel of 4-bit routed experts, its rows and its pairs per workgroup: `qmm_moe`,
/// or with `coop` (as [`qmm_shape`]) `qmm_coop_moe` with 64-pair tiles (a 512-token chunk gives
/// the 26B's 128 experts 32 pairs each on average: a 128-pair tile would be three quarters
/// duplicates).
pub fn qmm_moe_shape(coop: bool) -> (Kernel, u32, u32) {
    if coop {
        (Kernel::QmmCoopMoe { tb: 1, rb: 4 }, 128, 64)
    } else {
        (Kernel::QmmMoe, 16 * QMM_MOE_TM, QMM_TOK)
    }
}

/// Rows per thread of `qmm_moe` (TM of qmm_core.wgsl): qmm's rule.
pub const QMM_MOE_TM: u32 = 4;

/// Ranges `qmm` (or with `coop`, `qmm_coop`) splits the k loop of a `rows` × `cols` matrix into
/// for chunks of `tokens` tokens with tiles of `rows_per_wg` rows × `tok_per_wg` tokens (1: no
/// split): 1, 2, 4 or 8, each range whole 64-value groups.
/// - `qmm` (SIMT): the fewest that give at least [`QMM_MIN_WORKGROUPS`] workgroups, each range
///   at least 256 values long.
/// - `qmm_coop`: the fewest of least modelled time (ledger: 2026-12-01 qmm-coop-split-model): one
///   128 × 128 tile fills an SM, so the tiles run in waves of [`QMM_COOP_WAVE`], each as long as
///   its range of k, and a split adds qmm_sum's pass over `splits + 1` partial outputs:
///   t ≈ ⌈tiles · s / wave⌉ · (cols / s) · 0.056 µs + \[s > 1\] · (s + 1) · rows · tokens · 3.3e-6 µs
///   (fitted on the H200's kbench rows: within 10 % of 40 of the 44 measured times of 11 E2B/E4B
///   shapes × 4 splits, median 3 %, the 256-row k projection's 20–38 % under, as its fixed costs
///   are not modelled; it picks the fastest measured split of each shape, where the workgroup
///   threshold missed both q projections).
pub fn qmm_splits(coop: bool, rows: usize, cols: usize, tokens: usize, rows_per_wg: u32, tok_per_wg: u32) -> u32 {
    let tiles = rows.div_ceil(rows_per_wg as usize) * tokens.div_ceil(tok_per_wg as usize);
    let valid = |s: usize| s == 1 || (cols.is_multiple_of(64 * s) && cols / s >= 256);
    if coop {
        // The model prices the partials' traffic itself: ranges need only be whole groups.
        let valid = |s: usize| cols.is_multiple_of(64 * s);
        let time = |s: usize| {
            let waves = (tiles * s).div_ceil(QMM_COOP_WAVE) as f64;
            let sum = if s > 1 { (s + 1) as f64 * (rows * tokens) as f64 * 3.3e-6 } else { 0.0 };
            waves * (cols / s) as f64 * 0.056 + sum
        };
        let best =
            [1usize, 2, 4, 8].into_iter().filter(|&s| valid(s)).fold(1, |b, s| if time(s) < time(b) { s } else { b });
        return best as u32;
    }
    let mut s = 1;
    while tiles * s < QMM_MIN_WORKGROUPS && valid(2 * s) && s < 8 {
        s *= 2;
    }
    s as u32
}

/// Workgroups below which `qmm_splits` splits the k loop of the SIMT `qmm`. Measured on the H200
/// (ledger: 2026-11-30 qmm-rule, 512-token chunks): E4B down (320 workgroups) 1142 → 951 µs split
/// in 2, E2B q|k|v (320) 179 → 160, E2B k (32) 223 → 77 split in 4; E4B q|k|v (384) no gain.
pub const QMM_MIN_WORKGROUPS: usize = 384;

/// qmm_coop tiles of 128 × 128 in flight at once on the H200 (132 SMs, one such workgroup each:
/// its 48 KiB of workgroup memory and 16 accumulator blocks per subgroup); the wave of
/// [`qmm_splits`]'s model. Other devices get the same model with this wave: a split is a speed
/// choice only, never a change in the result's tolerance.
pub const QMM_COOP_WAVE: usize = 132;

/// True when the prefill mat-mat `qmm` applies: 4-bit weights in whole 64-value groups and an
/// x stride of whole vec4s (as for `qmv`).
pub fn qmm_applies(format: Format, cols: usize, x_stride: usize) -> bool {
    format == Format::Q4 && cols.is_multiple_of(64) && x_stride.is_multiple_of(4)
}

/// group_sum's grid x for `n` = mult · G (row, group) pairs: 64 pairs per workgroup.
pub fn group_sum_groups_x(n: usize) -> u32 {
    n.div_ceil(64) as u32
}

/// The most values of a row an rmsnorm thread holds in registers (`V` in rmsnorm.wgsl): with
/// 256 threads, rows up to 3072 values (every Gemma 4 hidden size) are loaded in one round.
pub const RMSNORM_V: u32 = 12;

/// Threads of the decode and verify steps' norm ([`rmsnorm`]) where the device allows them
/// ([`Tuning::norm_threads`]' default).
/// A decode norm is one workgroup's latency chain: 1024 threads beat 256 (ledger: 2026-12-01
/// norm-threads-1024: tg128 E4B +0.5 %, 26B +1.6 %, E2B even), and 512 beats 1024 in the step
/// although the norm's own timestamped time does not fall (ledger: 2026-12-05 norm-threads-512:
/// E4B 251.3 → 256.3, E2B even). The 26B lost at 512 (276.5 → 272.8), in the timestamps through
/// its MoE close, which took these threads then ([`MOE_NORM_WG`]); its norms at 512 beside a
/// close at 1024 are even with 1024 everywhere (26B 275.4 / 274.4 → 275.1 / 275.3, E4B
/// 250.4 / 243.9 → 254.5 / 255.3; ledger: 2026-12-05 norm-threads-split).
pub const RMSNORM_WG: u32 = 512;

/// Threads of the MoE block's close ([`moe_norm`]) where the device allows them
/// ([`Tuning::moe_norm_threads`]' default): at 512 its
/// timestamped time rises 11.3 → 12.5 µs a dispatch and the 26B's tg128 falls 276.5 → 272.8
/// (ledger: 2026-12-05 norm-threads-512), so it keeps 1024.
pub const MOE_NORM_WG: u32 = 1024;

/// The threads of a one-workgroup decode norm: `want` where the device allows it, else 256
/// (every device's minimum).
fn decode_norm_wg(want: u32, max_threads: u32) -> u32 {
    if want <= max_threads {
        want
    } else {
        256
    }
}

/// The rmsnorm variant (decode and verify steps' norm) for rows of `n` values on a device that
/// runs up to `max_threads` invocations per workgroup: [`Tuning::norm_threads`] threads where it
/// can (256 where not), V = ceil(n / WG) (at most [`RMSNORM_V`]), so that a thread holds no
/// registers for values past the row. Chunks run the rows form (rmsnorm_rows.wgsl; one-workgroup
/// norms were slower there: ledger: 2026-12-01 rmsnorm-wg1024-all, 2026-12-01 rows-norms). Verify
/// steps run the same form, so verify = decode bitwise holds.
pub fn rmsnorm(n: usize, max_threads: u32, t: &Tuning) -> Kernel {
    let wg = decode_norm_wg(t.norm_threads, max_threads);
    Kernel::RmsNorm { v: rmsnorm_v(n, wg), wg }
}

/// Registers per thread of an rmsnorm of `wg` threads over rows of `n` values.
pub fn rmsnorm_v(n: usize, wg: u32) -> u32 {
    (n.div_ceil(wg as usize) as u32).clamp(1, RMSNORM_V)
}

/// The most vec4s of a row an rmsnorm_rows thread holds per array (`V4`).
pub const RMSNORM_ROWS_V4: u32 = 16;

/// Threads per row of the chunk norms' rows form ([`Tuning::rows_norms`]; 64 and 128 are kernel
/// variants the tests run).
pub const RMSNORM_ROWS_WG: u32 = 256;

/// The rows form of the chunk norm with params `p` on `wg` threads per row
/// (rmsnorm_rows.wgsl), where it applies: rows of vec4 (n, the strides the norm uses and its
/// weight offsets multiples of 4), at most [`RMSNORM_ROWS_V4`] vec4s per thread, and with
/// group sums (`p.sums` ≠ 0) one segment and groups of whole vec4s that tile the row; over
/// split-k partials (`p.splits` > 1), one segment of the chunk's own rows (x_stride = n, no
/// LM-head row selection).
pub fn rmsnorm_rows(p: &NormParams, wg: u32) -> Option<Kernel> {
    let chained = |off: u32, j: u32| p.chain < j || off.is_multiple_of(4);
    let vec4_rows = p.n.is_multiple_of(4)
        && p.x_stride.is_multiple_of(4)
        && p.out_stride.is_multiple_of(4)
        && (p.chain == 0 || p.out2_stride.is_multiple_of(4))
        && (p.w_off == NO_WEIGHT || p.w_off.is_multiple_of(4))
        && chained(p.w2_off, 1)
        && chained(p.w3_off, 2)
        && chained(p.w4_off, 3);
    let sums = p.sums != 0;
    let sums_fit = !sums || (p.segs == 1 && p.gs > 0 && p.gs.is_multiple_of(4) && p.n.is_multiple_of(p.gs));
    let parts = p.splits > 1;
    let parts_fit = !parts || (p.segs == 1 && p.x_stride == p.n && p.x_row_sel == 0 && p.count_sel == 0);
    if !matches!(wg, 64 | 128 | 256) || !vec4_rows || !sums_fit || !parts_fit {
        return None;
    }
    let v4 = p.n.div_ceil(4 * wg).max(1);
    (v4 <= RMSNORM_ROWS_V4).then_some(Kernel::RmsNormRows { v4, wg, sums, parts })
}

/// The MoE block's close (moe_norm.wgsl) for rows of `n` values and the router's top `k`, on
/// [`Tuning::moe_norm_threads`] threads where the device allows them (256 where not),
/// V = ceil(n / WG). Its sums run in the order of an rmsnorm of the same WG and V: decode and
/// verify both run this kernel, so nothing needs it to match the rmsnorm dispatches the step
/// runs elsewhere.
pub fn moe_norm(n: usize, k: usize, max_threads: u32, t: &Tuning) -> Kernel {
    let wg = decode_norm_wg(t.moe_norm_threads, max_threads);
    Kernel::MoeNorm { v: rmsnorm_v(n, wg), wg, k: k as u32 }
}

/// Threads per head of head_norm_rope and qkv_norm_rope at their widest: one pass over
/// d ≤ 1024 values; the form for heads wider than 512.
pub const HEAD_NORM_WG: u32 = 256;

/// The threads per head of the head norms for head dim `d`: 128 where d ≤ 512 (each thread
/// holds up to four values; ledger: 2026-12-01 head-norm-wg128: a chunk's qkv_norm_rope 0.57 →
/// 0.44 ms on E4B, decode's the same), else [`HEAD_NORM_WG`]; 64 threads (d ≤ 256; even in
/// chunks, ledger: 2026-12-01 head-norm-wg64-chunk) is a kernel variant the tests run.
pub fn head_norm_wg(d: usize) -> u32 {
    if d <= 4 * 128 {
        128
    } else {
        HEAD_NORM_WG
    }
}

/// The chunk attention variant for a head dimension (≤ 512, a multiple of 4: the value phase
/// splits a 64-key tile into slices of 16 / ceil(d / 256) keys).
pub fn attention_chunk(head_dim: usize) -> Kernel {
    Kernel::Attention { dv: (head_dim as u32).div_ceil(64) }
}

/// Tokens (queries) per workgroup of chunk attention (`BQ` in attention.wgsl).
pub const ATTN_BQ: u32 = 16;

/// Chunk attention on tensor cores for a head dimension, where it applies (a multiple of 64,
/// ≤ 512: the kernel's stages are 64 dims, and each subgroup keeps one 16 × 16 O block per
/// value stage in registers, 8 at most); the device must have f16 cooperative matrices in
/// subgroups of 32 (`Gpu::coop_f16`).
pub fn attention_chunk_coop(head_dim: usize) -> Option<Kernel> {
    (head_dim.is_multiple_of(64) && (64..=512).contains(&head_dim))
        .then_some(Kernel::AttentionCoop { d: head_dim as u32, sums: false })
}

/// Tokens (queries) per workgroup of attention_coop (`BQ` in attention_coop.wgsl). A 16-query,
/// 128-thread form lost on the H200 (ledger: 2026-12-01 attention-coop-q16; its code left the
/// tree in commit bbc4f7b).
pub const ATTN_COOP_BQ: u32 = 32;

/// Key splits per (head, token) of the decode attention: enough workgroups to fill a GPU at
/// 8–16 heads; at most 64 (attention_combine reads them in one pass).
pub const ATTN_SPLITS: u32 = 32;

/// Threads of one attention_split workgroup (`WG` in attention_tile.wgsl).
pub const ATTN_SPLIT_WG: u32 = 64;

/// Keys whose K (then V) rows attention_split loads together (`G` in attention_split.wgsl).
pub const ATTN_KEYS_IN_FLIGHT: u32 = 4;

/// Splits attention_combine reads per round (`U` in attention_combine.wgsl): half of
/// [`ATTN_SPLITS`], each a load in flight.
pub const COMBINE_U: u32 = 16;

/// The attention_split variant for a head dimension (≤ 1024); `qnorm`: its form that norms and
/// rotates q itself (attention_qnorm.wgsl).
pub fn attention_split(head_dim: usize, qnorm: bool) -> Kernel {
    Kernel::AttentionSplit { dk: (head_dim as u32).div_ceil(64), qnorm }
}

/// Decode and verify rows of at most this many keys take attention_short
/// ([`Tuning::attn_short`]'s default).
pub const ATTN_SHORT_MAX: u32 = 256;

/// The attention_short variant for a head dimension (a multiple of 8, ≤ 1024) on a device with
/// these limits: [`SHORT_WG_MAX`] threads per (head, token) where the device takes them and its
/// workgroup memory holds the kernel's arrays, else fewer.
pub fn attention_short(head_dim: usize, qnorm: bool, limits: &DeviceLimits) -> Kernel {
    attention_short_form(head_dim, qnorm, SHORT_WG_MAX, limits)
}

/// The largest attention_short workgroup a decode or verify step takes. On the H200 with group
/// 0's sum, 512 threads against 1024 (ledger: 2026-12-05 attention-short-wg512, two alternating
/// rounds each): E2B tg128 380.8 / 381.6 → 383.9 / 383.5, E4B 249.7 / 249.6 → 251.3 / 251.1, the
/// 26B 277.2 / 276.5 → 277.6 / 277.3 (1024 had won with the tree sum in the shape sweep, ledger:
/// 2026-12-03 attention-short-shape, against other G / GV at 512; plain 512 had not been run in
/// the step).
pub const SHORT_WG_MAX: u32 = 512;

/// attention_short on at most `max_wg` threads per (head, token) (1024, 512 or 256: the largest
/// of them the device's limits allow).
pub fn attention_short_form(head_dim: usize, qnorm: bool, max_wg: u32, limits: &DeviceLimits) -> Kernel {
    let d4 = head_dim as u32 / 4;
    let wg = [1024u32, 512, 256]
        .into_iter()
        .filter(|&wg| wg <= max_wg)
        .find(|&wg| {
            wg <= limits.max_threads
                && wg <= limits.max_workgroup_x
                && short_shared_bytes(d4, wg, qnorm) <= limits.max_workgroup_bytes
        })
        .unwrap_or(256);
    Kernel::AttentionShort { d4, wg, qnorm }
}

/// attention_short's workgroup memory: qs (1024 floats), sc and red (WG each), vh and, in the
/// q-norm form, qn_red (WG).
fn short_shared_bytes(d4: u32, wg: u32, qnorm: bool) -> u32 {
    4 * (1024 + 2 * wg + if qnorm { wg } else { 0 }) + 16 * short_vh_vec4s(wg, short_shape(d4, wg).tv)
}

/// attention_short's vh in vec4s: the sums of every value group after the first, which group 0
/// adds after one barrier. That beat a halving tree of the groups on the H200 (ledger: 2026-12-05
/// attention-short-sum-group0, two alternating rounds, 1024 threads): E2B tg128 378.8 / 379.2 →
/// 381.7 / 381.4, E4B 248.6 / 248.5 → 248.9 / 249.9, the 26B 276.4 / 276.2 → 276.7 / 277.1;
/// kbench 0.02–0.46 µs faster per dispatch at every row length (16–1025 keys).
pub fn short_vh_vec4s(wg: u32, tv: u32) -> u32 {
    (wg - tv).max(1)
}

/// attention_short's thread shapes for a head dim of `d4` vec4s (the constants of
/// attention_short.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortShape {
    /// Lanes per key in the score phase: 16 up to head dim 256 (four vec4s per lane there),
    /// 32 past it.
    pub tpk: u32,
    /// vec4s of a key row per lane.
    pub vpl: u32,
    /// Keys per team in flight.
    pub g: u32,
    /// Lanes per value row: a power of two ≥ d4 (one vec4 per lane), at least 64.
    pub tv: u32,
    /// Value rows per group in flight.
    pub gv: u32,
}

/// attention_short's thread shapes for `d4` vec4s a row on `wg` threads.
pub fn short_shape(d4: u32, wg: u32) -> ShortShape {
    let tpk = if d4 <= 64 { 16 } else { 32 };
    // Keys and value rows in flight: 2 and 4 were the fastest of the shape sweep (ledger:
    // 2026-12-03 attention-short-shape).
    let (g, gv) = (2, 4);
    ShortShape { tpk, vpl: d4.div_ceil(tpk), g, tv: d4.next_power_of_two().clamp(64, wg), gv }
}

/// Threads of one router_topk workgroup (one per expert: the most experts it takes; the
/// backend refuses models with more: WgpuBackend::with_gpu).
pub const ROUTER_TOPK_WG: u32 = 256;

/// Logits each thread of softcap_argmax holds (its loads in flight).
pub const ARGMAX_U: u32 = 8;

/// Logits per softcap_argmax workgroup (256 threads × [`ARGMAX_U`]): a 262144-entry row is 128
/// workgroups, and argmax_merge reduces 128 pairs.
pub const ARGMAX_CHUNK: u32 = 256 * ARGMAX_U;

/// softcap_argmax's workgroups per row (grid x) and the pairs argmax_merge reads per row.
pub fn argmax_chunks(vocab: usize) -> u32 {
    (vocab as u32).div_ceil(ARGMAX_CHUNK)
}

#[cfg(test)]
mod tests {
    /// The split rule of the tensor-core mat-mat against the H200's kbench table it was fitted to
    /// (ledger: 2026-12-01 qmm-coop-split-model; the two-accumulator rows of the kbench run of
    /// ledger: 2026-12-01 qmm-coop-one-acc: µs for 1, 2, 4, 8 ranges of a 512-token chunk,
    /// 128 × 128 tiles): the split it picks must have measured within 1 % of the fastest of every
    /// shape (E2B q|k|v's 1 and 4 are a tie).
    #[test]
    fn qmm_coop_split_rule_picks_the_measured_fastest() {
        let table: [(&str, usize, usize, [f64; 4]); 11] = [
            ("E2B q_proj", 2048, 1536, [94.3, 56.6, 64.9, 81.1]),
            ("E2B k_proj", 256, 1536, [90.7, 55.9, 34.5, 23.8]),
            ("E2B gate/up", 6144, 1536, [180.1, 158.1, 187.1, 241.2]),
            ("E2B down", 1536, 6144, [347.0, 179.7, 188.0, 152.3]),
            ("E4B q_proj", 2048, 2560, [150.1, 83.6, 92.0, 108.0]),
            ("E4B gate/up", 10240, 2560, [430.8, 393.6, 438.8, 528.8]),
            ("E4B down", 2560, 10240, [550.1, 579.1, 438.7, 389.7]),
            ("E2B q|k|v", 2560, 1536, [92.6, 104.9, 92.1, 103.6]),
            ("E2B gate|up", 12288, 1536, [263.9, 310.7, 366.0, 473.0]),
            ("E4B q|k|v", 3072, 2560, [144.3, 160.9, 134.7, 164.6]),
            ("E4B gate|up", 20480, 2560, [700.0, 778.7, 872.6, 1026.2]),
        ];
        for (name, rows, cols, us) in table {
            let fastest = us.iter().copied().fold(f64::MAX, f64::min);
            let s = super::qmm_splits(true, rows, cols, 512, 128, 128);
            let picked = us[s.trailing_zeros() as usize];
            assert!(picked <= fastest * 1.01, "{name}: picked {s} ranges ({picked} µs), fastest {fastest} µs: {us:?}");
        }
    }

    /// The fused-norm policy (ledger: 2026-12-03 fuse-wide-gated): below PRO_MAX_HIDDEN every
    /// kind, past it only the kinds `wide` names, never with `up_to` 0 (the unfused option the
    /// tests use).
    #[test]
    fn norms_fuse_past_the_width_only_into_the_kinds_named() {
        use super::{fuse_norm_into, Kernel, WideFuse, PRO_MAX_HIDDEN};
        let plain = Kernel::Qmv { tok: 1, lanes: 32, rpt: 2, pro: 0, digits: false };
        let glu = Kernel::QmvGlu { tok: 1, lanes: 16, pairs: 1, pro: 0, digits: false };
        let gated = Kernel::QmvGeluB { tok: 1, lanes: 32, rpt: 1, pro: 0, digits: false };
        for k in [plain, glu, gated] {
            assert!(fuse_norm_into(k, 1536, PRO_MAX_HIDDEN, WideFuse::None), "{k:?} at 1536");
            assert!(!fuse_norm_into(k, 1536, 0, WideFuse::GatedGlu), "{k:?} with fusion off");
            assert!(fuse_norm_into(k, 2560, usize::MAX, WideFuse::None), "{k:?} at 2560, everything fused");
            assert!(!fuse_norm_into(k, 2560, PRO_MAX_HIDDEN, WideFuse::None), "{k:?} at 2560, the width rule");
        }
        assert!(
            fuse_norm_into(gated, 2560, PRO_MAX_HIDDEN, WideFuse::Gated)
                && !fuse_norm_into(glu, 2560, PRO_MAX_HIDDEN, WideFuse::Gated)
        );
        assert!(
            fuse_norm_into(glu, 2816, PRO_MAX_HIDDEN, WideFuse::GatedGlu)
                && !fuse_norm_into(plain, 2816, PRO_MAX_HIDDEN, WideFuse::GatedGlu)
        );
    }
}
