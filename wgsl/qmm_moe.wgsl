// qmm_moe: the 4-bit mat-mat of routed experts in prefill chunks. For group s (an expert, or a
// cache slot when experts stream) and each of its routed pairs q = t · top_k + j (moe_group's
// list, ascending):
//   y[q · y_stride + r] = Σ_c W[s · expert_stride + row_off + r, c] · x[t · x_tok_stride + j · x_slot_stride + c]
// for rows r < rows: qmm's tile (qmm_core.wgsl) over the group's pairs in tiles of 64, so each
// expert's weights are dequantised once per 64 of its tokens (the matmul-style grouped kernel,
// moe_matmul_grouped.wgsl, loaded them once per 8 and did 8 multiply-adds per load).
//
// Bindings: w, scales, biases (MLX affine 4-bit, as qmm.wgsl); groups: moe_group's lists
//   (group s at s · group_stride: count, then the pairs); x: f32 read as vec4; y: f32;
//   p: MoeMatmulParams (moe_params.wgsl; n_groups); step: Step.
// Launch: 256 threads; workgroup (g, i) takes group g / ceil(rows / BM), rows
//   [BM · (g % ceil(rows / BM)), + BM) and the group's pairs [64 i, 64 i + 64); grid =
//   (n_groups · ceil(rows / BM), ceil(n_tokens / 64)) (a group has at most n_tokens pairs), x
//   folded into x·z past 65535; tiles past a group's count return at once.
// Host guarantees: cols % 64 == 0, x_tok_stride % 4 == 0, x_slot_stride % 4 == 0.
// The sums differ in rounding from the decode kernel's (qmv_moe: lanes and a reduction tree),
// as qmm's differ from qmv's; every chunk size and token order gives the same values per pair.

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;

// vec4 offset of pair q's x row.
fn x_row(q: u32) -> u32 {
    return ((q / p.top_k) * p.x_tok_stride + (q % p.top_k) * p.x_slot_stride) / 4u;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let row_tiles = (p.rows + BM - 1u) / BM;
    let g = wid.x + wid.z * nwg.x;
    let s = g / row_tiles;
    // Uniform per workgroup, so returning before qmm_tile's barriers is safe.
    if (s >= p.n_groups) { return; }
    let gbase = s * p.group_stride;
    let count = groups[gbase];
    let t0 = wid.y * BN;
    if (t0 >= count) { return; }
    let r0 = (g % row_tiles) * BM;
    let wr = s * p.expert_stride + p.row_off + min(r0 + lid / TPR, p.rows - 1u);
    let xo0 = x_row(groups[gbase + 1u + min(t0 + lid / 8u, count - 1u)]);
    let xo1 = x_row(groups[gbase + 1u + min(t0 + lid / 8u + 32u, count - 1u)]);
    let acc = qmm_tile(wr, xo0, xo1, p.cols, p.gs, 0u, p.cols, lid);
    let rb = r0 + (lid / 16u) * TM;
    let tb = t0 + lid % 16u;
    // @unroll j TN
    if (tb + {j}u * 16u < count) {
        let q = groups[gbase + 1u + tb + {j}u * 16u];
        // @unroll i TM
        if (rb + {i}u < p.rows) { y[q * p.y_stride + rb + {i}u] = acc[{i}u * TN + {j}u]; }
        // @end i
    }
    // @end j
}
