// attention_qnorm: attention_split.wgsl's query normalised and rotated in the kernel, for layers
// whose q is not written by qkv_norm_rope (KV-sharing layers, separate projections): the
// head_norm_rope dispatch for q goes, one dependent dispatch fewer per such layer in decode and
// verify steps (ledger: 2026-12-01 fold-q-norm). Appended by the host to attention_split's
// source (which declares q, p, qs, WG, DK and first_key).
//
// load_query_normed(t, h, lid): qs = rope(norm(x) · w) for x = q[t · src_stride + src_off + h·d
//   ..][..d], as head_norm_core.wgsl computes it (the same products and rotate-half; the sum of
//   squares added in another order: each lane's DK values, then a 64-wide tree), and returns the
//   first position the query attends to, as load_query.
//
// Bindings 6–8: wt: f32 norm weights (w at w_off); rope: f32 per-step cos/sin table in
//   head_norm_core.wgsl's layout (row t at t · rope_stride + rope_off); qn: QNormParams.
// Host guarantees: q always has a norm weight and a rope (Gemma 4's q_norm); d ≤ 64 · DK.

struct QNormParams {
    src_stride: u32,
    src_off: u32,
    w_off: u32,
    rope_off: u32,
    rope_stride: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(6) var<storage, read> wt: array<f32>;
@group(0) @binding(7) var<storage, read> rope: array<f32>;
@group(0) @binding(8) var<uniform> qn: QNormParams;

var<workgroup> qn_red: array<f32, WG>;

fn load_query_normed(t: u32, h: u32, lid: u32) -> u32 {
    let d = p.d;
    let half = d / 2u;
    let sb = t * qn.src_stride + qn.src_off + h * d;
    let rb = t * qn.rope_stride + qn.rope_off;
    // Every load is issued before the sum needs the first (head_norm_core.wgsl: why).
    // @unroll k DK
    let i{k} = {k}u * WG + lid;
    var x{k} = 0.0;
    var w{k} = 0.0;
    var c{k} = 1.0;
    var s{k} = 0.0;
    if (i{k} < d) {
        x{k} = q[sb + i{k}];
        w{k} = wt[qn.w_off + i{k}];
        c{k} = rope[rb + i{k} % half];
        s{k} = rope[rb + half + i{k} % half];
    }
    // @end k
    var ss = 0.0;
    // @unroll k DK
    ss += x{k} * x{k};
    // @end k
    qn_red[lid] = ss;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) { qn_red[lid] += qn_red[lid + k]; }
        workgroupBarrier();
    }
    let r = 1.0 / sqrt(qn_red[0] / f32(d) + qn.eps);
    // @unroll k DK
    let n{k} = x{k} * r * w{k};
    if (i{k} < d) { qs[i{k}] = n{k}; }
    // @end k
    workgroupBarrier();
    // Rotate-half: dim i pairs with i ± d/2, another lane's value.
    // @unroll k DK
    var o{k} = 0.0;
    if (i{k} < d) {
        if (i{k} < half) {
            o{k} = n{k} * c{k} - qs[i{k} + half] * s{k};
        } else {
            o{k} = n{k} * c{k} + qs[i{k} - half] * s{k};
        }
    }
    // @end k
    workgroupBarrier();
    // @unroll k DK
    if (i{k} < d) { qs[i{k}] = o{k}; }
    // @end k
    workgroupBarrier();
    return first_key(step.pos0 + t, p.window);
}
