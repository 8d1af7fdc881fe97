// qmm_coop: qmm.wgsl on tensor cores (cooperative matrices): the 4-bit prefill mat-mat
//   y[t, y_off + r] = Σ_k W[r, k] · x[t, k]   for rows r < rows, tokens t < count,
// with qmm's bindings, params and split-k rows (the host prepends `enable f16; enable
// wgpu_cooperative_matrix;`, then common.wgsl, matmul_params.wgsl and formats/groups.wgsl, and
// substitutes TB, RB and expands the `@unroll` blocks).
//
// Bindings: w: MLX affine 4-bit, u32[rows * cols / 8]; scales, biases: bf16 pairs;
//   x: f32[count, x_stride] as vec4; y: f32[count (· k_splits), y_stride]; p: MatmulParams; step.
// Launch: 256 threads = 8 subgroups of exactly 32 (host guarantees it); workgroup (i, j) owns
//   rows [BM i, BM i + BM) × tokens [BN j', BN j' + BN) of k range s, j = s · ceil(count / BN) +
//   j', BM = 32 · RB, BN = 64 · TB; x folded into x·z past 65535 as in matmul.wgsl.
// Host guarantees: cols % (64 · max(S, 1)) == 0, x_stride % 4 == 0; |x| < 2^20 and |w| < 2^12
//   (f16's range after the power-of-two scalings below; past it the sums are ±inf or NaN).
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
// qmm_core.wgsl. The sums are not qmm's bit for bit (another order, other roundings).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

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

// The high half of v: its mantissa cut to f16's 10 bits (exact in f16), 0 below 2^-14.
fn high(v: vec4<f32>) -> vec4<f32> {
    let h = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xffffe000u));
    return select(h, vec4<f32>(0.0), abs(v) < vec4<f32>(6.103515625e-05));
}

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

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let lid = lid3.x;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = (wid.x + wid.z * nwg.x) * BM;
    let tiles = (count + BN - 1u) / BN;
    let split = wid.y / tiles;
    let t0 = (wid.y % tiles) * BN;
    let kspan = p.cols / max(p.k_splits, 1u);
    let kbeg = split * kspan;
    let kend = kbeg + kspan;
    let words = p.cols / 8u;
    let groups = p.cols / p.gs;

    // Staging roles: weight rows lid / 4 + 64 u, word lid % 4 of the stage (values 8 (lid % 4)
    // ..); x tokens lid / 8 + 32 v, vec4 lid % 8 of the stage.
    let sword = lid % 4u;
    let xq = lid % 8u;
    // @unroll u WPT
    let wr{u} = min(r0 + lid / 4u + {u}u * 64u, p.rows - 1u);
    let w_at{u} = (lid / 4u + {u}u * 64u) * SV + sword * 2u;
    // @end u
    // @unroll v XPT
    let xo{v} = (min(t0 + lid / 8u + {v}u * 32u, count - 1u) * p.x_stride) / 4u;
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
    var sc{u} = scale_at(wr{u} * groups + kbeg / p.gs);
    var bs{u} = bias_at(wr{u} * groups + kbeg / p.gs);
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
        sc{u} = scale_at(wr{u} * groups + kn / p.gs);
        bs{u} = bias_at(wr{u} * groups + kn / p.gs);
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
    // layout is the driver's, and y's rows and tokens past the end must not be written.
    let yrow0 = split * count;
    // @unroll i TB
    // @unroll j RB
    coopStoreT(c{i}_{j} + d{i}_{j} * LO, &cst[sg * 256u], 16u);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {
        let t = t0 + (tb + {i}u) * 16u + e / 16u;
        let r = r0 + (rb + {j}u) * 16u + e % 16u;
        if (t < count && r < p.rows) { y[(yrow0 + t) * p.y_stride + p.y_off + r] = cst[sg * 256u + e]; }
    }
    workgroupBarrier();
    // @end j
    // @end i
}
