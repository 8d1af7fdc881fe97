// qmm_coop_moe: qmm_moe.wgsl on tensor cores: the 4-bit mat-mat of routed experts in prefill
// chunks. For group s (an expert, or a cache slot when experts stream) and each of its routed
// pairs q = t · top_k + j (moe_group's list, ascending):
//   y[q · y_stride + r] = Σ_c W[s · expert_stride + row_off + r, c] · x[t · x_tok_stride + j · x_slot_stride + c]
// for rows r < rows, through qmm_coop_core.wgsl's tile (appended by the host after
// `enable f16; enable wgpu_cooperative_matrix;`, halves.wgsl, common.wgsl, moe_params.wgsl and
// formats/groups.wgsl), so each expert's weights are dequantised once per BN of its pairs.
//
// Bindings: as qmm_moe.wgsl (w, scales, biases; groups: moe_group's lists, group s at
//   s · group_stride: count, then the pairs; x: f32 as vec4; y: f32; p: MoeMatmulParams; step),
//   and xsum: the group sums (group_sum.wgsl) of x's rows — per token when x_slot_stride = 0
//   (every slot reads its token's x), else per pair (x_tok_stride = top_k · x_slot_stride), so
//   f32[n_tokens (· top_k), cols / gs].
// Launch: 256 threads = 8 subgroups of exactly 32; workgroup (g, i) takes group
//   g / ceil(rows / BM), rows [BM · (g % ceil(rows / BM)), + BM) and the group's pairs
//   [BN i, BN i + BN); grid = (n_groups · ceil(rows / BM), ceil(n_tokens / BN)), x folded into
//   x·z past 65535; tiles past a group's count return at once.
// Host guarantees: cols % 64 == 0, x_tok_stride % 4 == 0, x_slot_stride % 4 == 0, x_slot_stride
//   = 0 or x_tok_stride = top_k · x_slot_stride; |x| < 2^22,
//   scales s in [2^-20, 2^7) and |b + 8s| < 2^10 (f16's normal range after
//   qmm_coop_core.wgsl's power-of-two scalings; past it the sums are ±inf or NaN, or lose
//   bits).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;
@group(0) @binding(8) var<storage, read> xsum: array<f32>;

// The workgroup's place, for the functions the tile loop calls.
var<private> wbase: u32;
var<private> r0: u32;
var<private> t0: u32;
var<private> gbase: u32;
var<private> count: u32;

fn w_row(i: u32) -> u32 { return wbase + min(r0 + i, p.rows - 1u); }
fn x_vec4(t: u32) -> u32 {
    let q = groups[gbase + 1u + min(t0 + t, count - 1u)];
    return ((q / p.top_k) * p.x_tok_stride + (q % p.top_k) * p.x_slot_stride) / 4u;
}
fn xsum_at(t: u32) -> u32 {
    let q = groups[gbase + 1u + min(t0 + t, count - 1u)];
    return select(q, q / p.top_k, p.x_slot_stride == 0u) * (p.cols / p.gs);
}
fn y_store(t: u32, r: u32, v: f32) {
    if (t0 + t < count && r0 + r < p.rows) { y[groups[gbase + 1u + t0 + t] * p.y_stride + r0 + r] = v; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let row_tiles = (p.rows + BM - 1u) / BM;
    let g = wid.x + wid.z * nwg.x;
    let s = g / row_tiles;
    // Uniform per workgroup, so returning before the tile's barriers is safe.
    if (s >= p.n_groups) { return; }
    gbase = s * p.group_stride;
    count = groups[gbase];
    t0 = wid.y * BN;
    if (t0 >= count) { return; }
    r0 = (g % row_tiles) * BM;
    wbase = s * p.expert_stride + p.row_off;
    qmm_coop_tile(0u, p.cols, p.cols, p.gs, sg, lane);
}
