// qmm_coop: qmm.wgsl on tensor cores (cooperative matrices): the 4-bit prefill mat-mat
//   y[t, y_off + r] = Σ_k W[r, k] · x[t, k]   for rows r < rows, tokens t < count,
// with qmm's bindings, params and split-k rows (the host prepends `enable f16; enable
// wgpu_cooperative_matrix;` and halves.wgsl, then common.wgsl, matmul_params.wgsl and formats/groups.wgsl, and
// appends qmm_coop_core.wgsl: the tile loop, and why its arithmetic is exact enough).
//
// Bindings: w: MLX affine 4-bit, u32[rows * cols / 8]; scales, biases: bf16 pairs;
//   x: f32[count, x_stride] as vec4; y: f32[count (· k_splits), y_stride]; p: MatmulParams; step;
//   xsum: f32[count, cols / gs], x's group sums (group_sum.wgsl).
// Launch: 256 threads = 8 subgroups of exactly 32 (host guarantees it); workgroup (i, j) owns
//   rows [BM i, BM i + BM) × tokens [BN j', BN j' + BN) of k range s, j = s · ceil(count / BN) +
//   j', BM = 32 · RB, BN = 64 · TB; x folded into x·z past 65535 as in matmul.wgsl.
// Host guarantees: cols % (64 · max(S, 1)) == 0, x_stride % 4 == 0; |x| < 2^22, scales s in
//   [2^-20, 2^7) and |b + 8s| < 2^10 (f16's normal range after qmm_coop_core.wgsl's
//   power-of-two scalings; past it the sums are ±inf or NaN, or lose bits).

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;
@group(0) @binding(7) var<storage, read> xsum: array<f32>;

// The workgroup's place, for the functions the tile loop calls.
var<private> r0: u32;
var<private> t0: u32;
var<private> count: u32;
var<private> yrow0: u32;

fn w_row(i: u32) -> u32 { return min(r0 + i, p.rows - 1u); }
fn x_vec4(t: u32) -> u32 { return (min(t0 + t, count - 1u) * p.x_stride) / 4u; }
fn xsum_at(t: u32) -> u32 { return min(t0 + t, count - 1u) * (p.cols / p.gs); }
fn y_store(t: u32, r: u32, v: f32) {
    if (t0 + t < count && r0 + r < p.rows) { y[(yrow0 + t0 + t) * p.y_stride + p.y_off + r0 + r] = v; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    r0 = (wid.x + wid.z * nwg.x) * BM;
    let tiles = (count + BN - 1u) / BN;
    let split = wid.y / tiles;
    t0 = (wid.y % tiles) * BN;
    yrow0 = split * count;
    let kspan = p.cols / max(p.k_splits, 1u);
    qmm_coop_tile(split * kspan, split * kspan + kspan, p.cols, p.gs, sg, lane);
}
