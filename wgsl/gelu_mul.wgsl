// gelu_mul: a[t, i] = gelu_tanh(a[t, i]) · b'[t, i]   for i < n, t < step.n_tokens, where
//   b'[t, i] = b[t, b_off + i] (b_in_a 0) or a[t, b_off + i] (b_in_a 1: gate and up stacked in
//   one row of a, b_off ≥ n, the output over the gate half).
// GeGLU of the MLP (a = gate projection, b = up projection, or both in a) and the PLE gate
// (a = gate projection, b = the layer's slice of the per-layer inputs). gelu_tanh: gelu.wgsl.
//
// SUMS = 1 (Kernel::GeluMulSums, chunks): also asum[t · ceil(n / 64) + j] = Σ of the written
//   a[t, 64 j ..][..64] (the next mat-mat's group sums of x at group size 64: the PLE
//   projection reads them instead of a group_sum pass); each subgroup's sum, then the
//   workgroup's 64 / SG in order. And with p.splits > 1 (b_in_a 0, a_stride = n), a[t, i] is
//   read as the sum of a split-k mat-mat's partials part[(s · n_tokens + t) · n + i], added in
//   qmm_sum.wgsl's order: bitwise the value qmm_sum would have written, and its dispatch saved.
//
// Bindings: a: f32[n_tokens, a_stride] (in/out); b: f32[n_tokens, b_stride]; p: GeluParams; step;
//   asum: f32[n_tokens, ceil(n / 64)], part: f32[splits · n_tokens, n] (SUMS = 1).
// Launch: 64 threads, one element each; grid = (ceil(n / 64), n_tokens).

struct GeluParams {
    n: u32,
    a_stride: u32,
    b_stride: u32,
    b_off: u32,
    b_in_a: u32,
    splits: u32,
    _pad1: u32,
    _pad2: u32,
}


@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> p: GeluParams;
@group(0) @binding(3) var<uniform> step: Step;

fn up_at(i: u32, t: u32) -> f32 {
    if (p.b_in_a == 1u) { return a[t * p.a_stride + p.b_off + i]; }
    return b[t * p.b_stride + p.b_off + i];
}

fn gelu_mul_at(i: u32, t: u32) -> f32 {
    let v = gelu_tanh(a[t * p.a_stride + i]) * up_at(i, t);
    a[t * p.a_stride + i] = v;
    return v;
}

// @unroll n PLAIN
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= step.n_tokens) { return; }
    gelu_mul_at(i, t);
}
// @end n

// @unroll s SUMS
@group(0) @binding(4) var<storage, read_write> asum: array<f32>;
@group(0) @binding(5) var<storage, read> part: array<f32>;

// gelu_mul_at over a split-k mat-mat's partials instead of a (p.splits > 1).
fn gelu_mul_split_at(i: u32, t: u32) -> f32 {
    var g = part[t * p.n + i];
    for (var s = 1u; s < p.splits; s++) { g += part[(s * step.n_tokens + t) * p.n + i]; }
    let v = gelu_tanh(g) * up_at(i, t);
    a[t * p.a_stride + i] = v;
    return v;
}
const WG: u32 = 64u;
const SG: u32 = {{SG}}u;
var<workgroup> red: array<f32, WG>;
// {{WORKGROUP_SUM}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    let t = wid.y;
    // t is the workgroup's: a return on it keeps the sums below in uniform control flow.
    if (t >= step.n_tokens) { return; }
    var v = 0.0;
    if (i < p.n) {
        if (p.splits > 1u) { v = gelu_mul_split_at(i, t); } else { v = gelu_mul_at(i, t); }
    }
    let s = workgroup_sum(v, lid);
    if (lid == 0u) { asum[t * ((p.n + 63u) / 64u) + wid.x] = s; }
}
// @end s
