// qmm_coop_core: the tile loop of the tensor-core prefill mat-mat, shared by qmm_coop.wgsl (dense
// chunks), qmm_coop_moe.wgsl (a routed expert's tokens) and qmm_coop_glu.wgsl (a stacked
// gate|up with the GeGLU as epilogue). Appended by the host after the
// kernel (which declares `w`, `scales`, `biases`: array<u32> and `x`: array<vec4<f32>>, and
// three functions: w_row(i), the absolute W row of tile row i; x_vec4(t), the vec4 offset of
// tile token t's x row; y_store(t, r, v), which writes tile token t, tile row r when both are
// real), with formats/groups.wgsl (and gelu.wgsl for the GeGLU form), TB and RB substituted and
// the `@unroll` blocks expanded (PLAIN / GLU: the plain or the GeGLU epilogue, below).
//
// qmm_coop_tile(kbeg, kend, cols, gs, sg, lane): the workgroup's BM-row × BN-token tile over k
// in [kbeg, kend), BM = 32 · RB, BN = 64 · TB; 256 threads = 8 subgroups of exactly 32 (host
// guarantees it); every thread must call it (barriers). kend − kbeg is a multiple of 32 and
// each 32-value stage lies in one quantisation group.
//
// Why two f16 halves (PERF_NOTES.md, sessions 6 and 9): x in f16 misses the fixtures' tolerance
// by 10–50×, while x = x_hi + x_lo is as exact as f32. Here both x and the dequantised weight
// w = s·q + b (f32, as qmm) are split: v_hi is v with its mantissa cut to f16's 10 bits (0 below
// f16's normal range), v_lo = (v − v_hi) · 2^11, so that the low half is as far from f16's
// subnormals as the high half (the H200 loses subnormal f16 halves: an unscaled low half left
// 2^-12 of x, session 9). Products are hi·hi into one f32 accumulator and lo·hi + hi·lo into a
// second, scaled by 2^-11 at the end; the dropped lo·lo and the rounding of the low halves leave
// ~2^-21 of a product. x is scaled by 2^-4 and w by 2^4 first (powers of two: products
// unchanged) so activations up to 2^20 stay in f16's range.
// Each 32-value stage: the threads dequantise BM × 32 weights and split BN × 32 x values into
// workgroup memory as [row or token][k] f16 (stride SX: 16 bytes of padding per row; stored and
// loaded as vec4<f16>, so the stride coopLoad takes is in vec4s, SV); subgroup
// g multiplies its TB token blocks (of 16) by its RB row blocks in two 16-deep k steps. The next
// stage's weights and x are loaded into registers before this stage's products, as in
// qmm_core.wgsl. The staging and the products still run back to back (on the H200 about half
// the time each; what was tried to overlap them, and lost: PERF_NOTES.md, session 9). The sums
// are not qmm's bit for bit (another order, other roundings). The routed experts' tile has the
// weights exact in f16 instead (qmm_coop_exact_core.wgsl: faster at 64 pairs, not at 128 tokens).

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

// Whole vec4<f16>s: one 8-byte store per four values instead of four 2-byte ones.
var<workgroup> xh: array<vec4<f16>, BN * SV>; // [token][k / 4], x · 2^-4, high half
var<workgroup> xl: array<vec4<f16>, BN * SV>; // low half · 2^11
var<workgroup> wh: array<vec4<f16>, BM * SV>; // [row][k / 4], w · 2^4, high half
var<workgroup> wl: array<vec4<f16>, BM * SV>;
var<workgroup> cst: array<f32, 8u * 256u>; // one 16 × 16 output block per subgroup, [token][row]

fn split_x(v: vec4<f32>, at: u32) {
    let h = high(v);
    xh[at] = vec4<f16>(h);
    xl[at] = vec4<f16>((v - h) * 2048.0);
}

fn split_w(v: vec4<f32>, at: u32) {
    let h = high(v);
    wh[at] = vec4<f16>(h);
    wl[at] = vec4<f16>((v - h) * 2048.0);
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

    // @unroll u WPT
    var wv{u} = w[wr{u} * words + kbeg / 8u + sword];
    var sc{u} = scale_at(wr{u} * groups + kbeg / gs);
    var bs{u} = bias_at(wr{u} * groups + kbeg / gs);
    // @end u
    // @unroll v XPT
    var xv{v} = x[xo{v} + kbeg / 4u + xq];
    // @end v
    for (var k0 = kbeg; k0 < kend; k0 += KS) {
        // w · 2^4 = (16 s) · q + 16 b, the nibbles pre-divided by 16^j as in qmm_core.wgsl.
        // @unroll u WPT
        {
            let s16 = sc{u} * 16.0;
            let sv = vec4<f32>(s16, s16 * 0.0625, s16 * 0.00390625, s16 * 0.000244140625);
            split_w(nibbles(wv{u}) * sv + bs{u} * 16.0, w_at{u});
            split_w(nibbles(wv{u} >> 16u) * sv + bs{u} * 16.0, w_at{u} + 1u);
        }
        // @end u
        // @unroll v XPT
        split_x(xv{v} * 0.0625, x_at{v});
        // @end v
        workgroupBarrier();
        // The next stage (the last one again after the end: a harmless reload).
        let kn = min(k0 + KS, kend - KS);
        // @unroll u WPT
        wv{u} = w[wr{u} * words + kn / 8u + sword];
        sc{u} = scale_at(wr{u} * groups + kn / gs);
        bs{u} = bias_at(wr{u} * groups + kn / gs);
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
            let bh{j} = coopLoad<coop_mat16x16<f16, B>>(&wh[(rb + {j}u) * 16u * SV + kk], SV);
            let bl{j} = coopLoad<coop_mat16x16<f16, B>>(&wl[(rb + {j}u) * 16u * SV + kk], SV);
            // @end j
            // @unroll i TB
            // @unroll j RB
            d{i}_{j} = coopMultiplyAdd(al{i}, bh{j}, d{i}_{j});
            d{i}_{j} = coopMultiplyAdd(ah{i}, bl{j}, d{i}_{j});
            c{i}_{j} = coopMultiplyAdd(ah{i}, bh{j}, c{i}_{j});
            // @end j
            // @end i
        }
        workgroupBarrier();
    }

    // Each block through the subgroup's slot of workgroup memory to y: the blocks' register
    // layout is the driver's, and y_store keeps out what lies past the real rows and tokens.
    // The GeGLU form (GLU = 1): tile rows 0..63 are gate rows and 64..127 the up rows of the
    // same indices, so subgroup g < 4 and g + 4 hold a gate block and its up block:
    // y_store(t, r, gelu_tanh(gate) · up) for the 64 gate rows.
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
        for (var e = lane; e < 256u; e += 32u) {
            y_store((tb + {i}u) * 16u + e / 16u, (rb + {j}u) * 16u + e % 16u, gelu_tanh(cst[sg * 256u + e]) * cst[(sg + 4u) * 256u + e]);
        }
    }
    // @end g
    workgroupBarrier();
    // @end j
    // @end i
}
