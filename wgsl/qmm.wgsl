// qmm: 4-bit mat-mat for prefill chunks: y[t, y_off + r] = Σ_k W[r, k] · x[t, k]
// for rows r < rows, tokens t < count.
//
// Bindings (the same as matmul.wgsl, so it is that kernel's chunk variant):
//   w: MLX affine 4-bit, u32[rows * cols / 8] (8 values per word, element j at bits 4j..4j+3);
//   scales, biases: bf16[rows * cols / gs], two per u32 (element 2i in the low half);
//   x: f32[count, x_stride] read as vec4<f32>; y: f32[count, y_stride]; p: MatmulParams; step: Step.
// Launch: 256 threads; workgroup (i, j) owns rows [64 i, 64 i + 64) × tokens [64 j, 64 j + 64);
//   grid = (ceil(rows / 64), ceil(count / 64)), x folded into x·z past 65535 as in matmul.wgsl.
// Host guarantees: cols % 64 == 0 (a 32-value step lies in one quantisation group: gs is a
//   multiple of 64), x_stride % 4 == 0.
//
// Why (PERF_NOTES.md): the 8-token matmul tile spends its time on loads, re-reading every weight
// for each 8 tokens. Here a workgroup stages a 64-row × 32-value slice of W, dequantised once,
// and the matching 64-token × 32-value slice of x in workgroup memory, and each thread then
// accumulates a 4-row × 4-token block from them: 16 multiply-adds per two vec4 reads of
// workgroup memory, each weight byte read from memory once per 64 tokens.
// Each output is one sequential f32 sum over k in column order (value = s·q + b, as load8).
const TILE: u32 = 64u;
const KS: u32 = 32u;

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

// [k][rows / 4] and [k][tokens / 4]: one vec4 holds 4 rows (4 tokens) of one column k.
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = (wid.x + wid.z * nwg.x) * TILE;
    let t0 = wid.y * TILE;
    let words = p.cols / 8u;
    let groups = p.cols / p.gs;
    // Staging roles: weights, 4 threads per row (one u32 = 8 values each); x, 2 vec4 per thread.
    let wrow = lid / 4u;
    let wword = lid % 4u;
    let wr = min(r0 + wrow, p.rows - 1u);
    // Compute role: a 4-row × 4-token block.
    let tr = lid / 16u;
    let tc = lid % 16u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.cols; k0 += KS) {
        // Stage W[r0.., k0..k0+32) dequantised, transposed to [k][row].
        let word = w[wr * words + k0 / 8u + wword];
        let g = wr * groups + k0 / p.gs;
        let s = scale_at(g);
        let b = bias_at(g);
        for (var j = 0u; j < 8u; j++) {
            ws[(wword * 8u + j) * 16u + wrow / 4u][wrow % 4u] = s * f32((word >> (4u * j)) & 0xfu) + b;
        }
        // Stage x[t0.., k0..k0+32) transposed to [k][token].
        for (var u = 0u; u < 2u; u++) {
            let idx = lid + u * 256u;
            let tok = idx / 8u;
            let kq = idx % 8u;
            let xt = min(t0 + tok, count - 1u);
            let v = x[(xt * p.x_stride) / 4u + k0 / 4u + kq];
            xs[(kq * 4u + 0u) * 16u + tok / 4u][tok % 4u] = v.x;
            xs[(kq * 4u + 1u) * 16u + tok / 4u][tok % 4u] = v.y;
            xs[(kq * 4u + 2u) * 16u + tok / 4u][tok % 4u] = v.z;
            xs[(kq * 4u + 3u) * 16u + tok / 4u][tok % 4u] = v.w;
        }
        workgroupBarrier();
        for (var k = 0u; k < KS; k++) {
            let a = ws[k * 16u + tr];
            let bx = xs[k * 16u + tc];
            acc0 += a.x * bx;
            acc1 += a.y * bx;
            acc2 += a.z * bx;
            acc3 += a.w * bx;
        }
        workgroupBarrier();
    }
    let rb = r0 + tr * 4u;
    let tb = t0 + tc * 4u;
    // @unroll r 4
    if (rb + {r}u < p.rows) {
        // @unroll t 4
        if (tb + {t}u < count) { y[(tb + {t}u) * p.y_stride + p.y_off + rb + {r}u] = acc{r}[{t}u]; }
        // @end t
    }
    // @end r
}
