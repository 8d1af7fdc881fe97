// qmm_coop_core: the tile loop of the tensor-core prefill mat-mat, shared by qmm_coop.wgsl (dense
// chunks), qmm_coop_moe.wgsl (a routed expert's tokens) and qmm_coop_glu.wgsl (a stacked
// gate|up with the GeGLU as epilogue). Appended by the host after the kernel (which declares
// `w`, `scales`, `biases`: array<u32>, `x`: array<vec4<f32>> and `xsum`: array<f32>, and four
// functions: w_row(i), the absolute W row of tile row i; x_vec4(t), the vec4 offset of tile
// token t's x row; xsum_at(t), the offset of that row's group sums in xsum (group_sum.wgsl);
// y_store(t, r, v), which writes tile token t, tile row r when both are real), with
// formats/groups.wgsl (and gelu.wgsl for the GeGLU form), TB and RB substituted and the
// `@unroll` blocks expanded (PLAIN / GLU: the plain or the GeGLU epilogue, below).
//
// qmm_coop_tile(kbeg, kend, cols, gs, sg, lane): the workgroup's BM-row × BN-token tile over k
// in [kbeg, kend), BM = 32 · RB, BN = 64 · TB; 256 threads = 8 subgroups of exactly 32 (host
// guarantees it); every thread must call it (barriers). kend − kbeg is a multiple of 32, each
// 32-value stage lies in one quantisation group and kbeg is a group's first value.
//
// Why this arithmetic (ledger: 2026-11-30 f16-activations, 2026-11-30 f16-hi-lo, 2026-11-30
// qmm-coop, 2026-12-01 qmm-coop-group-sum): x in f16 misses the fixtures' tolerance by 10–50×,
// while x = x_hi + x_lo is as exact as f32: x_hi is x with its mantissa cut to f16's 10 bits (0
// below f16's normal range), x_lo = (x − x_hi) · 2^11, so that the low half is as far from f16's
// subnormals as the high half (the H200 loses subnormal f16 halves: an unscaled low half left 2^-12
// of x, ledger: 2026-11-30 qmm-coop-three-mma). The weights need no split: MLX's w = s·q + b is
// written as s·(q − 8) + b' with b' = b + 8s, and s·(q − 8), a bf16 scale (8 significant bits)
// times an integer in [−8, 7] (≤ 3), has ≤ 11 and is exact in f16. So each product is two
// tensor-core products, x_hi·w into one f32 accumulator (c) and x_lo·w into a second (d, scaled
// by 2^-11 at the end). The bias part Σ_g b'_g · Σ_{k ∈ g} x_k runs on the tensor cores after
// the k loop, 8 groups per 16-deep step: A rows are a token's [Σx_hi of the 8 groups | Σx_lo of
// them] (the sums from group_sum.wgsl, read from xsum), B columns a row's [b'_hi | 0] (into c) and
// [b'_lo | b'_hi] (into d). What is dropped or rounded is ~2^-21 of a product. x is scaled by
// 2^-6 and w by 2^6 (powers of two: products unchanged), so activations up to 2^22 and scales
// down to 2^-20 stay in f16's normal range. With BIAS_PF (the host's choice per kernel,
// kernels::qmm_bias_prefetch) each bias step's operands are loaded a step ahead, the first
// step's before the k loop, as the k loop loads its next stage; the same arithmetic, so the same
// bits. The dense 128 × 128 tile gains ≈ 1 % with it, the GeGLU and routed-expert tiles lose
// (ledger: 2026-12-01 qmm-bias-prefetch).
// Why the sums come from a pass of their own (ledger: 2026-12-01 qmm-coop-exact-bias-blocks,
// 2026-12-01 qmm-coop-exact-ceilings, 2026-12-01 qmm-coop-group-sum): taken in the k
// loop by the threads that stage x (shuffles every group, a bias step every 8) they cost the
// 128 × 128 tile more than the third product and the weights' low half they replace; without
// them the loop is 15–22 % faster than with split weights.
// Each 32-value stage: the threads dequantise BM × 32 weights and split BN × 32 x values into
// workgroup memory as [row or token][k] f16 (stride SX: 16 bytes of padding per row; stored and
// loaded as vec4<f16>, so the stride coopLoad takes is in vec4s, SV); subgroup
// g multiplies its TB token blocks (of 16) by its RB row blocks in two 16-deep k steps. The next
// stage's weights and x are loaded into registers before this stage's products, as in
// qmm_core.wgsl. The staging and the products still run back to back (what was tried to
// overlap them, and lost: ledger: 2026-12-01 qmm-coop-double-buffer, 2026-12-01
// qmm-coop-ceilings). The sums are not qmm's bit for bit
// (another order, other roundings).

const TB: u32 = {{TB}}u;       // token blocks of 16 per subgroup (4 subgroups along tokens)
const RB: u32 = {{RB}}u;       // row blocks of 16 per subgroup (2 subgroups along rows)
const BN: u32 = 64u * TB;
const BM: u32 = 32u * RB;
const KS: u32 = 32u;
const SX: u32 = KS + 8u;       // f16 per staged row: 80 bytes, a multiple of 16 as coopLoad wants
const SV: u32 = SX / 4u;       // the same in vec4<f16>: the arrays' unit and coopLoad's stride
const WPT: u32 = BM / 64u;     // weight words each thread stages per stage (BM · 4 / 256)
const XPT: u32 = BN / 32u;     // x vec4s each thread stages per stage (BN · 8 / 256)
const LO: f32 = 0.00048828125; // 2^-11
const XS: f32 = 0.015625;      // x is scaled by 2^-6, w by 2^6
const NG: u32 = 8u;            // quantisation groups per bias step
const BIAS_PF: bool = {{BIAS_PF}}; // the bias steps' operands loaded a step ahead

// Whole vec4<f16>s: one 8-byte store per four values instead of four 2-byte ones. 48 KiB in all
// at 128 × 128 (the H200's limit).
var<workgroup> xh: array<vec4<f16>, BN * SV>; // [token][k / 4], x · 2^-6, high half
var<workgroup> xl: array<vec4<f16>, BN * SV>; // low half · 2^11
var<workgroup> wq: array<vec4<f16>, BM * SV>; // [row][k / 4], 2^6 · s · (q − 8), exact
var<workgroup> xs: array<vec4<f16>, BN * 4u>; // [token][Σx_hi × 8 | Σx_lo × 8], · 2^-6
var<workgroup> bq: array<vec4<f16>, BM * 6u>; // [row][b'_lo × 8 | b'_hi × 8 | 0 × 8], · 2^6
var<workgroup> cst: array<f32, 8u * 256u>; // one 16 × 16 output block per subgroup, [token][row]

// (q − 8) · 16^j for the four nibbles of the low 16 bits of h (nibble j at bits 4j..4j+3): as
// nibbles() in formats/groups.wgsl (masked in place, OR-ed into the mantissa of 2^23), with
// 2^23 + 8 · 16^j subtracted in the same exact step.
fn centred(h: u32) -> vec4<f32> {
    let m = vec4<u32>(h) & vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
    return bitcast<vec4<f32>>(m | vec4<u32>(0x4b000000u)) - vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);
}

// One bias step's raw operands for a thread: Σx of its token (x) and s, b of its row for groups
// g .. g + 3 of the range (relative to xrow, brow), zero past ng or where the role is not real.
struct BiasOps {
    x: vec4<f32>,
    s: vec4<f32>,
    b: vec4<f32>,
}

fn bias_ops(g: u32, ng: u32, xrow: u32, brow: u32, xreal: bool, breal: bool) -> BiasOps {
    var o = BiasOps(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var e = 0u; e < 4u; e++) {
        if (g + e < ng) {
            if (xreal) { o.x[e] = xsum[xrow + g + e]; }
            if (breal) {
                o.s[e] = scale_at(brow + g + e);
                o.b[e] = bias_at(brow + g + e);
            }
        }
    }
    return o;
}

fn qmm_coop_tile(kbeg: u32, kend: u32, cols: u32, gs: u32, sg: u32, lane: u32) {
    let lid = sg * 32u + lane;
    let words = cols / 8u;
    let groups = cols / gs;

    // Staging roles: weight rows lid / 4 + 64 u, word lid % 4 of the stage (values 8 (lid % 4)
    // ..); x tokens lid / 8 + 32 v, vec4 lid % 8 of the stage.
    let sword = lid % 4u;
    let xq = lid % 8u;
    // @unroll u WPT
    let wr{u} = w_row(lid / 4u + {u}u * 64u);
    let w_at{u} = (lid / 4u + {u}u * 64u) * SV + sword * 2u;
    // @end u
    // @unroll v XPT
    let xo{v} = x_vec4(lid / 8u + {v}u * 32u);
    let x_at{v} = (lid / 8u + {v}u * 32u) * SV + xq;
    // @end v

    // This subgroup's blocks: token blocks (sg % 4) TB + i, row blocks (sg / 4) RB + j.
    let tb = (sg % 4u) * TB;
    let rb = (sg / 4u) * RB;
    // @unroll i TB
    // @unroll j RB
    var c{i}_{j} = coop_mat16x16<f32, C>();
    var d{i}_{j} = coop_mat16x16<f32, C>();
    // @end j
    // @end i

    // The bias part's operand roles (after the k loop): the tile's BN tokens and BM rows, two
    // threads each (four groups apiece). Its first step's operands are loaded here, so that their
    // latency hides behind the k loop (BIAS_PF).
    let g0 = kbeg / gs;
    let ng = (kend - kbeg) / gs;
    let st = lid / 2u;
    let half = lid % 2u;
    let xrow = xsum_at(st % BN) + g0;
    let brow = w_row(st % BM) * groups + g0;
    var ops = BiasOps(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    if (BIAS_PF) { ops = bias_ops(half * 4u, ng, xrow, brow, st < BN, st < BM); }

    // @unroll u WPT
    var wv{u} = w[wr{u} * words + kbeg / 8u + sword];
    var sc{u} = scale_at(wr{u} * groups + kbeg / gs);
    // @end u
    // @unroll v XPT
    var xv{v} = x[xo{v} + kbeg / 4u + xq];
    // @end v
    for (var k0 = kbeg; k0 < kend; k0 += KS) {
        // 2^6 · s · (q − 8), exact in f32 (≤ 11 significant bits) and so in f16; the scale is
        // pre-divided by 16^j as the nibbles are pre-multiplied.
        // @unroll u WPT
        {
            let s64 = sc{u} * 64.0;
            let sv = vec4<f32>(s64, s64 * 0.0625, s64 * 0.00390625, s64 * 0.000244140625);
            wq[w_at{u}] = vec4<f16>(centred(wv{u}) * sv);
            wq[w_at{u} + 1u] = vec4<f16>(centred(wv{u} >> 16u) * sv);
        }
        // @end u
        // @unroll v XPT
        {
            let v = xv{v} * XS;
            let h = high(v);
            xh[x_at{v}] = vec4<f16>(h);
            xl[x_at{v}] = vec4<f16>((v - h) * 2048.0);
        }
        // @end v
        workgroupBarrier();
        // The next stage (the last one again after the end: a harmless reload).
        let kn = min(k0 + KS, kend - KS);
        // @unroll u WPT
        wv{u} = w[wr{u} * words + kn / 8u + sword];
        sc{u} = scale_at(wr{u} * groups + kn / gs);
        // @end u
        // @unroll v XPT
        xv{v} = x[xo{v} + kn / 4u + xq];
        // @end v
        for (var kk = 0u; kk < KS / 4u; kk += 4u) {
            // @unroll i TB
            let ah{i} = coopLoadT<coop_mat16x16<f16, A>>(&xh[(tb + {i}u) * 16u * SV + kk], SV);
            let al{i} = coopLoadT<coop_mat16x16<f16, A>>(&xl[(tb + {i}u) * 16u * SV + kk], SV);
            // @end i
            // @unroll j RB
            let b{j} = coopLoad<coop_mat16x16<f16, B>>(&wq[(rb + {j}u) * 16u * SV + kk], SV);
            // @end j
            // @unroll i TB
            // @unroll j RB
            d{i}_{j} = coopMultiplyAdd(al{i}, b{j}, d{i}_{j});
            c{i}_{j} = coopMultiplyAdd(ah{i}, b{j}, c{i}_{j});
            // @end j
            // @end i
        }
        workgroupBarrier();
    }

    // The bias part, 8 groups of the range per step (groups past the range are zeros). With
    // BIAS_PF the next step's operands are loaded before this step's barrier and products, as
    // the k loop loads its next stage.
    for (var gb = 0u; gb < ng; gb += NG) {
        if (!BIAS_PF) { ops = bias_ops(gb + half * 4u, ng, xrow, brow, st < BN, st < BM); }
        if (st < BN) {
            let v = ops.x * XS;
            let h = high(v);
            xs[st * 4u + half] = vec4<f16>(h);
            xs[st * 4u + 2u + half] = vec4<f16>((v - h) * 2048.0);
        }
        if (st < BM) {
            let v = (ops.b + 8.0 * ops.s) * 64.0;
            let h = high(v);
            bq[st * 6u + half] = vec4<f16>((v - h) * 2048.0);
            bq[st * 6u + 2u + half] = vec4<f16>(h);
            bq[st * 6u + 4u + half] = vec4<f16>(0.0h);
        }
        if (BIAS_PF) { ops = bias_ops(gb + NG + half * 4u, ng, xrow, brow, st < BN, st < BM); }
        workgroupBarrier();
        // [Σx_hi | Σx_lo] · [b'_hi | 0] into c, · [b'_lo | b'_hi] into d.
        // @unroll i TB
        let s{i} = coopLoadT<coop_mat16x16<f16, A>>(&xs[(tb + {i}u) * 16u * 4u], 4u);
        // @end i
        // @unroll j RB
        let eh{j} = coopLoad<coop_mat16x16<f16, B>>(&bq[(rb + {j}u) * 16u * 6u + 2u], 6u);
        let el{j} = coopLoad<coop_mat16x16<f16, B>>(&bq[(rb + {j}u) * 16u * 6u], 6u);
        // @end j
        // @unroll i TB
        // @unroll j RB
        c{i}_{j} = coopMultiplyAdd(s{i}, eh{j}, c{i}_{j});
        d{i}_{j} = coopMultiplyAdd(s{i}, el{j}, d{i}_{j});
        // @end j
        // @end i
        workgroupBarrier();
    }

    // Each block through the subgroup's slot of workgroup memory to y: the blocks' register
    // layout is the driver's, and y_store keeps out what lies past the real rows and tokens.
    // The GeGLU form (GLU = 1): tile rows 0..63 are gate rows and 64..127 the up rows of the
    // same indices, so subgroup g < 4 and g + 4 hold a gate block and its up block:
    // y_store(t, r, gelu_tanh(gate) · up) for the 64 gate rows. It also sums each token's 64
    // GeGLU values (one quantisation group of the down projection's x, which reads the sums
    // instead of a group_sum pass): lane l of a gate subgroup adds rows l % 16 of tokens
    // l / 16 + 2k (k < 8) of each of its blocks, the 16 lanes of a token are added by butterfly
    // at the end, ysum_store(t, Σ) writes them (rows past the real ones add nothing).
    // @unroll g GLU
    // @unroll i TB
    // @unroll k 8
    var ys{i}_{k} = 0.0;
    // @end k
    // @end i
    // @end g
    // @unroll i TB
    // @unroll j RB
    coopStoreT(c{i}_{j} + d{i}_{j} * LO, &cst[sg * 256u], 16u);
    workgroupBarrier();
    // @unroll n PLAIN
    for (var e = lane; e < 256u; e += 32u) {
        y_store((tb + {i}u) * 16u + e / 16u, (rb + {j}u) * 16u + e % 16u, cst[sg * 256u + e]);
    }
    // @end n
    // @unroll g GLU
    if (sg < 4u) {
        // @unroll k 8
        {
            let e = lane + {k}u * 32u;
            let r = (rb + {j}u) * 16u + e % 16u;
            let v = gelu_tanh(cst[sg * 256u + e]) * cst[(sg + 4u) * 256u + e];
            y_store((tb + {i}u) * 16u + e / 16u, r, v);
            ys{i}_{k} += select(0.0, v, row_real(r));
        }
        // @end k
    }
    // @end g
    workgroupBarrier();
    // @end j
    // @end i
    // @unroll g GLU
    if (sg < 4u) {
        // @unroll i TB
        // @unroll k 8
        {
            var s = ys{i}_{k};
            s += subgroupShuffleXor(s, 1u);
            s += subgroupShuffleXor(s, 2u);
            s += subgroupShuffleXor(s, 4u);
            s += subgroupShuffleXor(s, 8u);
            if (lane % 16u == 0u) { ysum_store((tb + {i}u) * 16u + lane / 16u + {k}u * 2u, s); }
        }
        // @end k
        // @end i
    }
    // @end g
}
