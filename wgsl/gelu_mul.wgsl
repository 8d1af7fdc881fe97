// gelu_mul: a[t, i] = gelu_tanh(a[t, i]) · b[t, b_off + i]   for i < n, t < step.n_tokens.
// GeGLU of the MLP (a = gate projection, b = up projection) and the PLE gate (a = gate
// projection, b = the layer's slice of the per-layer inputs).
// gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))); tanh is computed from exp so that large
// |x| saturate cleanly instead of relying on the platform tanh.
//
// Bindings: a: f32[n_tokens, a_stride] (in/out); b: f32[n_tokens, b_stride]; p: GeluParams; step.
// Launch: 64 threads, one element each; grid = (ceil(n / 64), n_tokens).

struct GeluParams {
    n: u32,
    a_stride: u32,
    b_stride: u32,
    b_off: u32,
}


@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> p: GeluParams;
@group(0) @binding(3) var<uniform> step: Step;

fn tanh_stable(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * (1.0 - e) / (1.0 + e);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= step.n_tokens) { return; }
    let x = a[t * p.a_stride + i];
    let g = 0.5 * x * (1.0 + tanh_stable(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    a[t * p.a_stride + i] = g * b[t * p.b_stride + p.b_off + i];
}
