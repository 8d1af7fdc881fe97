// qmm_core: the tile loop of the 4-bit prefill mat-mat, shared by qmm.wgsl (dense chunks) and
// qmm_moe.wgsl (a routed expert's tokens). Prepended by the host after the kernel's bindings (`w`:
// array<u32>, `scales`, `biases`: array<u32>, `x`: array<vec4<f32>>), with formats/groups.wgsl
// (scale_at, bias_at, nibbles), TM substituted and the `@unroll` blocks expanded.
//
// qmm_tile(wr, xo0, xo1, cols, gs, kbeg, kend, lid): a workgroup's BM-row × 64-token tile over
// k in [kbeg, kend): thread lid stages W row `wr` (absolute; TPR threads per row, words
// (lid % TPR) · WPT ..) and the x rows at vec4 offsets xo0 (tile token lid / 8) and xo1 (tile
// token lid / 8 + 32), vec4 lid % 8 of each 32-value stage; it returns the sums of rows
// tr · TM + i and tokens tc + 16 j of the tile, (tr, tc) = (lid / 16, lid % 16), at
// [i * TN + j]. Callers clamp what they pass to real rows and tokens. Every thread of the
// workgroup must call it (barriers).
//
// Why this shape (ledger: 2026-11-30 qmm-v2): the BM-row × 32-value slice of W is dequantised
// once per stage and the 64-token slice of x staged beside it, both as [row][k] with one vec4 of
// padding per row (the 16 tokens a quarter-warp reads fall in distinct banks; nothing is
// transposed on the way in, every store is a whole vec4). Each thread accumulates a TM-row ×
// 4-token block; the next stage's weights, scales, biases and x are loaded into registers before
// the current stage is computed, so their latency overlaps the arithmetic. Nibbles become floats
// as in qmv_core.wgsl (masked in place, OR-ed into 2^23, the scale pre-divided by 16^j: exactly
// s·q). Each output is one sequential f32 sum over k in column order (value = s·q + b, as load8).
const TM: u32 = {{TM}}u;
const TN: u32 = 4u;
const BM: u32 = 16u * TM;
const BN: u32 = 64u;
const KS: u32 = 32u;
const KP: u32 = KS / 4u + 1u;   // vec4s per staged row, one of them padding
const WPT: u32 = TM / 4u;       // weight words each thread stages per stage (BM · 4 / 256)
const TPR: u32 = 4u / WPT;      // staging threads per weight row

var<workgroup> ws: array<vec4<f32>, BM * KP>; // [row][k / 4]
var<workgroup> xs: array<vec4<f32>, BN * KP>; // [token][k / 4]

fn qmm_tile(wr: u32, xo0: u32, xo1: u32, cols: u32, gs: u32, kbeg: u32, kend: u32, lid: u32) -> array<f32, TM * TN> {
    let words = cols / 8u;
    let groups = cols / gs;
    let srow = lid / TPR;
    let sword = (lid % TPR) * WPT;
    let xq = lid % 8u;
    let tr = lid / 16u;
    let tc = lid % 16u;
    // @unroll i TM
    // @unroll j TN
    var acc{i}_{j} = 0.0;
    // @end j
    // @end i

    // Stage 0 into registers.
    // @unroll u WPT
    var wv{u} = w[wr * words + kbeg / 8u + sword + {u}u];
    // @end u
    var sg = scale_at(wr * groups + kbeg / gs);
    var bg = bias_at(wr * groups + kbeg / gs);
    var xa = x[xo0 + kbeg / 4u + xq];
    var xb = x[xo1 + kbeg / 4u + xq];
    for (var k0 = kbeg; k0 < kend; k0 += KS) {
        let sv = vec4<f32>(sg, sg * 0.0625, sg * 0.00390625, sg * 0.000244140625);
        // @unroll u WPT
        ws[srow * KP + (sword + {u}u) * 2u] = nibbles(wv{u}) * sv + bg;
        ws[srow * KP + (sword + {u}u) * 2u + 1u] = nibbles(wv{u} >> 16u) * sv + bg;
        // @end u
        xs[(lid / 8u) * KP + xq] = xa;
        xs[(lid / 8u + 32u) * KP + xq] = xb;
        workgroupBarrier();
        // The next stage (the last one again after the end: a harmless reload).
        let kn = min(k0 + KS, kend - KS);
        // @unroll u WPT
        wv{u} = w[wr * words + kn / 8u + sword + {u}u];
        // @end u
        sg = scale_at(wr * groups + kn / gs);
        bg = bias_at(wr * groups + kn / gs);
        xa = x[xo0 + kn / 4u + xq];
        xb = x[xo1 + kn / 4u + xq];
        // Unrolled (8 steps of 4 k values): the next step's reads of workgroup memory can be
        // issued while this step's multiply-adds run.
        let wb = tr * TM * KP;
        // @unroll k 8
        {
            // @unroll i TM
            let a{i} = ws[wb + {i}u * KP + {k}u];
            // @end i
            // @unroll j TN
            let b{j} = xs[(tc + {j}u * 16u) * KP + {k}u];
            // @end j
            // @unroll i TM
            // @unroll j TN
            acc{i}_{j} = acc{i}_{j} + a{i}.x * b{j}.x;
            acc{i}_{j} = acc{i}_{j} + a{i}.y * b{j}.y;
            acc{i}_{j} = acc{i}_{j} + a{i}.z * b{j}.z;
            acc{i}_{j} = acc{i}_{j} + a{i}.w * b{j}.w;
            // @end j
            // @end i
        }
        // @end k
        workgroupBarrier();
    }
    var out: array<f32, TM * TN>;
    // @unroll i TM
    // @unroll j TN
    out[{i}u * TN + {j}u] = acc{i}_{j};
    // @end j
    // @end i
    return out;
}
