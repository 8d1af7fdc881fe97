// qkv_norm_rope: head_norm_rope for all three projections of a stacked q | k | v row in one
// dispatch (a KV-owning layer whose q, k and v are one matrix): per token t,
//   q heads h < n_q:   norm(src[t, h*d ..]) · w_q, rope   → dq[t, h*d ..]
//   k heads h < n_kv:  norm(src[t, k_off + h*d ..]) · w_k, rope → dk[kv_row(pos0 + t), h*d ..]
//   v heads h < n_kv:  norm(src[t, v_off + h*d ..]) (no weight, no rope) → dv[kv_row(pos0 + t), h*d ..]
// (v_off = k_off for K-as-V layers: V is the raw K projection). Norm and rope:
// head_norm_core.wgsl (appended by the host); the same values head_norm_rope writes.
//
// Bindings: src: f32[n_tokens, src_stride]; wt: f32[..] norm weights; rope: f32 per-step table;
//   dq: f32[n_tokens, n_q * d]; dk, dv: f32[slots (+ staging), n_kv * d]; p: QkvParams; step.
// Launch: WG threads per (head, token) (head_norm_core.wgsl); grid = (n_q + 2 · n_kv, n_tokens).
// d ≤ 4 · WG.

struct QkvParams {
    d: u32,
    src_stride: u32,
    rope_off: u32,
    rope_stride: u32,
    n_q: u32,
    n_kv: u32,
    k_off: u32,
    v_off: u32,
    q_w: u32,
    k_w: u32,
    slots: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> wt: array<f32>;
@group(0) @binding(2) var<storage, read> rope: array<f32>;
@group(0) @binding(3) var<storage, read_write> dq: array<f32>;
@group(0) @binding(4) var<storage, read_write> dk: array<f32>;
@group(0) @binding(5) var<storage, read_write> dv: array<f32>;
@group(0) @binding(6) var<uniform> p: QkvParams;
@group(0) @binding(7) var<uniform> step: Step;

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    // Which projection this workgroup's head belongs to (uniform per workgroup).
    var seg = 0u;
    var h = wid.x;
    var off = 0u;
    var w_off = p.q_w;
    if (h >= p.n_q + p.n_kv) {
        seg = 2u;
        h -= p.n_q + p.n_kv;
        off = p.v_off;
        w_off = NO_WEIGHT;
    } else if (h >= p.n_q) {
        seg = 1u;
        h -= p.n_q;
        off = p.k_off;
        w_off = p.k_w;
    }
    let d = p.d;
    let v = head_values(t * p.src_stride + off + h * d, d, w_off, seg != 2u, t * p.rope_stride + p.rope_off, p.eps, lid);
    if (seg == 0u) {
        let db = t * (p.n_q * d) + h * d;
        // @unroll j 4
        if (lid + {j}u * WG < d) { dq[db + lid + {j}u * WG] = v[{j}]; }
        // @end j
        return;
    }
    let db = kv_row(step.pos0 + t, p.slots) * (p.n_kv * d) + h * d;
    if (seg == 1u) {
        // @unroll j 4
        if (lid + {j}u * WG < d) { dk[db + lid + {j}u * WG] = v[{j}]; }
        // @end j
    } else {
        // @unroll j 4
        if (lid + {j}u * WG < d) { dv[db + lid + {j}u * WG] = v[{j}]; }
        // @end j
    }
}
