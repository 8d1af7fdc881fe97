// qmm: 4-bit mat-mat for prefill chunks: y[t, y_off + r] = Σ_k W[r, k] · x[t, k]
// for rows r < rows, tokens t < count.
//
// Bindings (the same as matmul.wgsl, so it is that kernel's chunk variant):
//   w: MLX affine 4-bit, u32[rows * cols / 8] (8 values per word, element j at bits 4j..4j+3);
//   scales, biases: bf16[rows * cols / gs], two per u32 (element 2i in the low half);
//   x: f32[count, x_stride] read as vec4<f32>; y: f32[count, y_stride]; p: MatmulParams; step: Step.
// Launch: 256 threads; workgroup (i, j) owns rows [BM i, BM i + BM) × tokens [64 j', 64 j' + 64)
//   of k range s, j = s · ceil(count / 64) + j', BM = 16 · TM; grid = (ceil(rows / BM),
//   ceil(count / 64) · max(k_splits, 1)), x folded into x·z past 65535 as in matmul.wgsl.
// Split k (k_splits = S > 1): range s covers k in [s · cols / S, (s + 1) · cols / S) and its
//   partial sums go to y row s · count + t; qmm_sum.wgsl adds the S partials in order. Few-row
//   matrices (E4B's down projection: 40 row tiles × 8 token tiles) would otherwise leave most of
//   the GPU's cores idle through a long k loop.
// Host guarantees: cols % (64 · max(S, 1)) == 0 (a 32-value stage lies in one quantisation
//   group: gs is a multiple of 64, and so is each range), x_stride % 4 == 0, TM ∈ {4, 8}.
//
// Why this shape (PERF_NOTES.md): a workgroup stages a BM-row × 32-value slice of W, dequantised
// once, and the matching 64-token slice of x in workgroup memory, both as [row][k] with one vec4
// of padding per row (the 16 tokens a quarter-warp reads fall in distinct banks; nothing is
// transposed on the way in, every store is a whole vec4). Each thread then accumulates a
// TM-row × 4-token block: TM · 16 multiply-adds per TM + 4 vec4 reads of workgroup memory (TM = 8:
// 128 per 12, where a 4 × 4 block does 64 per 8). The next stage's weights, scales, biases and x
// are loaded into registers before the current stage is computed, so their memory latency
// overlaps the arithmetic. Nibbles become floats as in qmv_core.wgsl (masked in place, OR-ed
// into 2^23, the scale pre-divided by 16^j: exactly s·q).
// Each output is one sequential f32 sum over k in column order (value = s·q + b, as load8).
const TM: u32 = {{TM}}u;
const TN: u32 = 4u;
const BM: u32 = 16u * TM;
const BN: u32 = 64u;
const KS: u32 = 32u;
const KP: u32 = KS / 4u + 1u;   // vec4s per staged row, one of them padding
const WPT: u32 = TM / 4u;       // weight words each thread stages per stage (BM · 4 / 256)
const TPR: u32 = 4u / WPT;      // staging threads per weight row

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

var<workgroup> ws: array<vec4<f32>, BM * KP>; // [row][k / 4]
var<workgroup> xs: array<vec4<f32>, BN * KP>; // [token][k / 4]

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = (wid.x + wid.z * nwg.x) * BM;
    let tiles = (count + BN - 1u) / BN;
    let split = wid.y / tiles;
    let t0 = (wid.y % tiles) * BN;
    let kspan = p.cols / max(p.k_splits, 1u);
    let kbeg = split * kspan;
    let kend = kbeg + kspan;
    let yrow0 = split * count;
    let words = p.cols / 8u;
    let groups = p.cols / p.gs;
    // Staging roles: weights, TPR threads per row (WPT words = 8 · WPT values each); x, 2 vec4s
    // per thread (8 threads per token row: 128 contiguous bytes).
    let srow = lid / TPR;
    let sword = (lid % TPR) * WPT;
    let wr = min(r0 + srow, p.rows - 1u);
    let xt0 = min(t0 + lid / 8u, count - 1u);
    let xt1 = min(t0 + lid / 8u + 32u, count - 1u);
    let xq = lid % 8u;
    // Compute role: rows tr · TM + i, tokens tc + 16 j.
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
    var sg = scale_at(wr * groups + kbeg / p.gs);
    var bg = bias_at(wr * groups + kbeg / p.gs);
    var xa = x[(xt0 * p.x_stride + kbeg) / 4u + xq];
    var xb = x[(xt1 * p.x_stride + kbeg) / 4u + xq];
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
        sg = scale_at(wr * groups + kn / p.gs);
        bg = bias_at(wr * groups + kn / p.gs);
        xa = x[(xt0 * p.x_stride + kn) / 4u + xq];
        xb = x[(xt1 * p.x_stride + kn) / 4u + xq];
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
    let rb = r0 + tr * TM;
    // @unroll i TM
    if (rb + {i}u < p.rows) {
        // @unroll j TN
        if (t0 + tc + {j}u * 16u < count) { y[(yrow0 + t0 + tc + {j}u * 16u) * p.y_stride + p.y_off + rb + {i}u] = acc{i}_{j}; }
        // @end j
    }
    // @end i
}
