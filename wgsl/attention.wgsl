// attention: o[t, h] = Σ_p softmax_p(q[t, h] · K[p, kvh]) · V[p, kvh]   (scale 1.0, Gemma 4)
//   for token t at position P = pos0 + t, query head h, kv head kvh = h / (n_heads / n_kv_heads),
//   over positions p in [lo, P]: lo = 0 (full layers) or max(0, P + 1 − window) (sliding layers).
// The cache is a ring: position p lives in row kv_row(p, slots) = p % slots, or a staging row in a
// verify step (common.wgsl) (slots ≥ window + chunk for sliding
// layers, so a chunk's own writes never evict a position one of its queries still needs).
//
// Bindings: q: f32[n_tokens, n_heads * d]; kc, vc: f32[slots, n_kv_heads * d];
//   o: f32[n_tokens, n_heads * d]; p: AttnParams; step: Step.
// Launch: 64 threads per (head, token); grid = (n_heads, n_tokens).
// The key loop is attend_keys (attention_tile.wgsl, prepended by the host).



@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let d = p.d;
    let qb = t * p.n_heads * d + h * d;
    let lo = load_query(t, h, lid);
    let ml = attend_keys(h / (p.n_heads / p.n_kv_heads), d, lo, step.pos0 + t + 1u, lid);
    for (var k = 0u; k < 16u; k++) {
        if (k * WG + lid < d) { o[qb + k * WG + lid] = acc[k] / ml.y; }
    }
}
