// gelu_mul: a[t, i] = gelu_tanh(a[t, i]) · b'[t, i]   for i < n, t < step.n_tokens, where
//   b'[t, i] = b[t, b_off + i] (b_in_a 0) or a[t, b_off + i] (b_in_a 1: gate and up stacked in
//   one row of a, b_off ≥ n, the output over the gate half).
// GeGLU of the MLP (a = gate projection, b = up projection, or both in a) and the PLE gate
// (a = gate projection, b = the layer's slice of the per-layer inputs). gelu_tanh: gelu.wgsl.
//
// Bindings: a: f32[n_tokens, a_stride] (in/out); b: f32[n_tokens, b_stride]; p: GeluParams; step.
// Launch: 64 threads, one element each; grid = (ceil(n / 64), n_tokens).

struct GeluParams {
    n: u32,
    a_stride: u32,
    b_stride: u32,
    b_off: u32,
    b_in_a: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}


@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> p: GeluParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= step.n_tokens) { return; }
    var up: f32;
    if (p.b_in_a == 1u) {
        up = a[t * p.a_stride + p.b_off + i];
    } else {
        up = b[t * p.b_stride + p.b_off + i];
    }
    a[t * p.a_stride + i] = gelu_tanh(a[t * p.a_stride + i]) * up;
}
