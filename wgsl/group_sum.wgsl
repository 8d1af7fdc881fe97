// group_sum: the sums of x over each quantisation group of its rows, which the tensor-core
// prefill mat-mats (qmm_coop_core.wgsl) need for the bias part of MLX's affine weights:
//   xsum[r · G + g] = Σ_{j < gs} x[r · stride + g · gs + j]   for rows r < count · mult, G = cols / gs
// (count = step.n_tokens, or step.n_out when count_sel = 1; mult rows per token: a routed
// expert's x holds top_k rows per token). The sum runs in f32 in order of j.
//
// Bindings: x: f32 as vec4; xsum: f32[count · mult, G]; p: GroupSumParams; step: Step.
// Launch: 64 threads, one (row, group) each; grid = (ceil(mult · G / 64), count).
// Host guarantees: stride % 4 == 0, gs % 4 == 0, cols % gs == 0.
// (A form with gs / 4 threads per group, each loading one vec4 beside its neighbours', lost on
// the H200: ledger: 2026-12-01 group-sum-wide; its code left the tree in commit b8092ab.)

struct GroupSumParams {
    cols: u32,
    gs: u32,
    stride: u32,
    mult: u32,
    count_sel: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xsum: array<f32>;
@group(0) @binding(2) var<uniform> p: GroupSumParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let groups = p.cols / p.gs;
    let i = gid.x;
    if (wid.y >= count || i >= p.mult * groups) { return; }
    let r = wid.y * p.mult + i / groups;
    let g = i % groups;
    let at = (r * p.stride + g * p.gs) / 4u;
    var acc = 0.0;
    for (var j = 0u; j < p.gs / 4u; j++) {
        let v = x[at + j];
        acc += v.x;
        acc += v.y;
        acc += v.z;
        acc += v.w;
    }
    xsum[r * groups + g] = acc;
}
