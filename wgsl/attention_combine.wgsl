// attention_combine: merges the n_splits partial softmaxes of attention_split.wgsl:
//   M = max_s m_s,  o[t, h, i] = Σ_s e^(m_s − M) · acc_s[i] / Σ_s e^(m_s − M) · l_s
// (empty splits have l_s = 0 and m_s = −3e38, so they weigh nothing).
//
// Bindings: part: f32[n_tokens, n_heads, n_splits, d + 2]; o: f32[n_tokens, n_heads * d];
//   p: AttnParams (d, n_heads, n_splits used); step: Step.
// Launch: 256 threads per (head, token), one output dim each per pass; grid = (n_heads, n_tokens).
// Host guarantees n_splits ≤ 64.
//
// Why this shape (PERF_NOTES.md): a decode step runs one small workgroup per head, so the
// kernel's time is its chain of dependent loads. The split maxima and weights are computed
// once into workgroup memory (not by every thread), and each output dim's sum over the splits
// reads U splits per round with a constant-trip inner loop, so U loads are in flight at once.
// The sums still run in split order: results do not depend on the unrolling.
const WG: u32 = 256u;
const U: u32 = 8u;
const MAX_SPLITS: u32 = 64u;
const NEG: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(0) @binding(2) var<uniform> p: AttnParams;
@group(0) @binding(3) var<uniform> step: Step;

var<workgroup> m_s: array<f32, MAX_SPLITS>;
var<workgroup> wt: array<f32, MAX_SPLITS>;
var<workgroup> inv_l: f32;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let d = p.d;
    let ns = p.n_splits;
    let base = (t * p.n_heads + h) * ns * (d + 2u);
    if (lid < ns) { m_s[lid] = part[base + lid * (d + 2u)]; }
    workgroupBarrier();
    if (lid < ns) {
        var mx = NEG;
        for (var s = 0u; s < ns; s++) { mx = max(mx, m_s[s]); }
        wt[lid] = exp(m_s[lid] - mx);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var l = 0.0;
        for (var s = 0u; s < ns; s++) { l += wt[s] * part[base + s * (d + 2u) + 1u]; }
        inv_l = l;
    }
    workgroupBarrier();
    let l = inv_l;
    for (var i = lid; i < d; i += WG) {
        var a = 0.0;
        for (var s0 = 0u; s0 < ns; s0 += U) {
            for (var u = 0u; u < U; u++) {
                let s = s0 + u;
                if (s < ns) { a += wt[s] * part[base + s * (d + 2u) + 2u + i]; }
            }
        }
        o[t * p.n_heads * d + h * d + i] = a / l;
    }
}
