// qmm_coop_glu: the GeGLU of a stacked [gate; up] 4-bit matrix on tensor cores, for prefill
// chunks: y[t, r] = gelu_tanh(Σ_k G[r, k] · x[t, k]) · Σ_k U[r, k] · x[t, k] for gate rows
// r < rows, tokens t < count, where W = [G; U] has 2 · rows rows (U's row r is W's row
// rows + r) — qmm_coop then gelu_mul in one dispatch (the host prepends `enable f16; enable
// wgpu_cooperative_matrix;`, halves.wgsl, common.wgsl, matmul_params.wgsl, gelu.wgsl and
// formats/groups.wgsl, and appends qmm_coop_core.wgsl with its GeGLU epilogue).
//
// Bindings: as qmm_coop.wgsl, xsum too (y written in the first `rows` values of each
//   y_stride-wide row, as gelu_mul leaves it; p.rows = rows, the gate's); ysum: f32[count,
//   ceil(rows / 64)], each token's sums of y over 64-row groups (the down projection's group
//   sums of x where its group size is 64; a partial last group sums its real rows).
// Launch: 256 threads = 8 subgroups of exactly 32; workgroup (i, j) owns gate rows
//   [64 i, 64 i + 64) and their up rows (the tile's 128 rows) × tokens [BN j, BN j + BN),
//   BN = 64 · TB (RB = 4); x folded into x·z past 65535. No split k (the GeGLU needs whole sums).
// Host guarantees: cols % 64 == 0, x_stride % 4 == 0, and the value ranges of qmm_coop.wgsl.

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;
@group(0) @binding(7) var<storage, read> xsum: array<f32>;
@group(0) @binding(8) var<storage, read_write> ysum: array<f32>;

// The workgroup's place, for the functions the tile loop calls.
var<private> r0: u32;
var<private> t0: u32;
var<private> count: u32;

// Tile rows 0..63: gate rows r0 ..; 64..127: the up rows of the same indices.
fn w_row(i: u32) -> u32 { return select(0u, p.rows, i >= 64u) + min(r0 + i % 64u, p.rows - 1u); }
fn x_vec4(t: u32) -> u32 { return (min(t0 + t, count - 1u) * p.x_stride) / 4u; }
fn xsum_at(t: u32) -> u32 { return min(t0 + t, count - 1u) * (p.cols / p.gs); }
fn y_store(t: u32, r: u32, v: f32) {
    if (t0 + t < count && r0 + r < p.rows) { y[(t0 + t) * p.y_stride + p.y_off + r0 + r] = v; }
}
fn row_real(r: u32) -> bool { return r0 + r < p.rows; }
// The tile's 64 gate rows are group r0 / 64 of the down projection's x.
fn ysum_store(t: u32, v: f32) {
    if (t0 + t < count) { ysum[(t0 + t) * ((p.rows + 63u) / 64u) + r0 / 64u] = v; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    count = step.n_tokens;
    r0 = (wid.x + wid.z * nwg.x) * 64u;
    t0 = wid.y * BN;
    qmm_coop_tile(0u, p.cols, p.cols, p.gs, sg, lane);
}
