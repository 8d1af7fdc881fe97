// moe_combine: out[t, r] = Σ_j weight[t, j] · src[(t * top_k + j) * n + r]   (j in slot order)
// The weighted sum of a token's routed experts' outputs (before post_feedforward_layernorm_2).
//
// Bindings: weight: f32[n_tokens, top_k]; src: f32[n_tokens * top_k, n]; out: f32[n_tokens, n];
//   p: CombineParams; step: Step.
// Launch: 64 threads, one output element each; grid = (ceil(n / 64), n_tokens).

struct CombineParams {
    n: u32,
    top_k: u32,
    _pad0: u32,
    _pad1: u32,
}


@group(0) @binding(0) var<storage, read> weight: array<f32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: CombineParams;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let t = gid.y;
    if (r >= p.n || t >= step.n_tokens) { return; }
    var s = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        s += weight[t * p.top_k + j] * src[(t * p.top_k + j) * p.n + r];
    }
    out[t * p.n + r] = s;
}
