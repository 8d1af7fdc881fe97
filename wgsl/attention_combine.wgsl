// attention_combine: merges the n_splits partial softmaxes of attention_split.wgsl:
//   M = max_s m_s,  o[t, h, i] = Σ_s e^(m_s − M) · acc_s[i] / Σ_s e^(m_s − M) · l_s
// (empty splits have l_s = 0 and m_s = −3e38, so they weigh nothing).
//
// Bindings: part: f32[n_tokens, n_heads, n_splits, d + 2]; o: f32[n_tokens, n_heads * d];
//   p: AttnParams (d, n_heads, n_splits used); step: Step.
// Launch: 64 threads per (head, token), one output dim each per pass; grid = (n_heads, n_tokens).
// Host guarantees n_splits ≤ 64.

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;



@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(0) @binding(2) var<uniform> p: AttnParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let d = p.d;
    let base = (t * p.n_heads + h) * p.n_splits * (d + 2u);
    var mx = NEG;
    for (var s = 0u; s < p.n_splits; s++) { mx = max(mx, part[base + s * (d + 2u)]); }
    var l = 0.0;
    for (var s = 0u; s < p.n_splits; s++) {
        let sb = base + s * (d + 2u);
        l += exp(part[sb] - mx) * part[sb + 1u];
    }
    for (var i = lid; i < d; i += WG) {
        var a = 0.0;
        for (var s = 0u; s < p.n_splits; s++) {
            let sb = base + s * (d + 2u);
            a += exp(part[sb] - mx) * part[sb + 2u + i];
        }
        o[t * p.n_heads * d + h * d + i] = a / l;
    }
}
