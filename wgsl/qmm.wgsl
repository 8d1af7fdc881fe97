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
// The tile loop is qmm_core.wgsl (appended by the host; why the shape: there). Each output is
// one sequential f32 sum over k in column order (value = s·q + b, as load8).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

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
    let wr = min(r0 + lid / TPR, p.rows - 1u);
    let xo0 = (min(t0 + lid / 8u, count - 1u) * p.x_stride) / 4u;
    let xo1 = (min(t0 + lid / 8u + 32u, count - 1u) * p.x_stride) / 4u;
    let acc = qmm_tile(wr, xo0, xo1, p.cols, p.gs, kbeg, kbeg + kspan, lid);
    let yrow0 = split * count;
    let rb = r0 + (lid / 16u) * TM;
    let tb = t0 + lid % 16u;
    // @unroll i TM
    if (rb + {i}u < p.rows) {
        // @unroll j TN
        if (tb + {j}u * 16u < count) { y[(yrow0 + tb + {j}u * 16u) * p.y_stride + p.y_off + rb + {i}u] = acc[{i}u * TN + {j}u]; }
        // @end j
    }
    // @end i
}
