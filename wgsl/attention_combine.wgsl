// attention_combine: merges the n_splits partial softmaxes of attention_split.wgsl:
//   M = max_s m_s,  o[t, h, i] = Σ_s e^(m_s − M) · acc_s[i] / Σ_s e^(m_s − M) · l_s
// (empty splits have l_s = 0 and m_s = −3e38, so they weigh nothing).
//
// Bindings: part: f32[n_tokens, n_heads, n_splits, d + 2]; o: f32[n_tokens, n_heads * d];
//   p: AttnParams (d, n_heads, n_splits used); step: Step.
// Launch: 256 threads per (head, token), one output dim each per pass; grid = (n_heads, n_tokens).
// Host guarantees n_splits ≤ 64.
//
// Why this shape (ledger: 2026-11-30 latency-hygiene): a decode step runs one small workgroup per
// head, so the kernel's time is its chain of dependent loads (a GPU issues in order: a load then
// its use waits a full round trip). Each split's (m, l) is loaded by its own thread, the weights
// are computed once into workgroup memory, and each output dim's sum over the splits issues U loads
// (an unrolled block) before adding them. The sums still run in split order.
const WG: u32 = 256u;
const U: u32 = {{U}}u;
const MAX_SPLITS: u32 = 64u;
const NEG: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(0) @binding(2) var<uniform> p: AttnParams;
@group(0) @binding(3) var<uniform> step: Step;

var<workgroup> m_s: array<f32, MAX_SPLITS>;
var<workgroup> wt: array<f32, MAX_SPLITS>;
var<workgroup> l_s: array<f32, MAX_SPLITS>;
var<workgroup> inv_l: f32;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    // attention_short's rows (attention_params.wgsl).
    if (short_row(step.pos0 + t)) { return; }
    let d = p.d;
    let ns = p.n_splits;
    let base = (t * p.n_heads + h) * ns * (d + 2u);
    // One thread per split loads its (m, l) (all in flight at once); the sums below read them
    // from workgroup memory instead of one global load per split in turn.
    if (lid < ns) {
        m_s[lid] = part[base + lid * (d + 2u)];
        l_s[lid] = part[base + lid * (d + 2u) + 1u];
    }
    workgroupBarrier();
    if (lid < ns) {
        var mx = NEG;
        for (var s = 0u; s < ns; s++) { mx = max(mx, m_s[s]); }
        wt[lid] = exp(m_s[lid] - mx);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var l = 0.0;
        for (var s = 0u; s < ns; s++) { l += wt[s] * l_s[s]; }
        inv_l = l;
    }
    workgroupBarrier();
    let l = inv_l;
    for (var i = lid; i < d; i += WG) {
        var a = 0.0;
        for (var s0 = 0u; s0 < ns; s0 += U) {
            // U loads issued, then summed in split order.
            // @unroll u U
            var pv{u} = 0.0;
            if (s0 + {u}u < ns) { pv{u} = part[base + (s0 + {u}u) * (d + 2u) + 2u + i]; }
            // @end u
            // @unroll u U
            if (s0 + {u}u < ns) { a += wt[s0 + {u}u] * pv{u}; }
            // @end u
        }
        o[t * p.n_heads * d + h * d + i] = a / l;
    }
}
