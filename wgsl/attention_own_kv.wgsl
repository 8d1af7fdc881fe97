// attention_own_kv: attention_short.wgsl's own-row form for a KV-owning layer's decode and verify
// steps, in place of its qkv_norm_rope dispatch (PERF_NOTES.md, session 32): q is normed and
// rotated from the raw q | k | v row by attention_qnorm.wgsl's prologue, and the row's k and v
// here, so a decode step's short row has one dependent dispatch where it had two. Appended by
// the host after attention_short.wgsl and attention_qnorm.wgsl, which declare q (the raw rows),
// kc and vc (read-write in this form), p, step, qn, wt, rope, WG, DK and workgroup_sum.
//
// own_kv(t, kvh, lid, write): for token t's position P = pos0 + t and kv head kvh,
//   k = rope(norm(x_k) · w_k), v = norm(x_v)   (v: no weight, no rope; x_v = x_k for K-as-V
//   layers, v_off = k_off), x_k at k_off + kvh·d and x_v at v_off + kvh·d in row t of q
//   (stride qn.src_stride), w_k at k_w in wt, q's rope row (qn.rope_off, rope_stride), eps qn.eps,
// into ks / vs (workgroup memory; own_k / own_v read them as vec4s) and, when `write`, into the
// caches' row kv_row(P). The same products and rotate-half as head_norm_core.wgsl (not the same
// bits: another pipeline, another sum order). Every thread of the workgroup calls it (barriers).
//
// Why a cache row has the same bits whichever step wrote it (verify bitwise decode): every row a
// decode or verify step writes comes from the one call site of own_kv in attention_short.wgsl,
// in one pipeline (the writer form and the attention are two dispatches of one kernel), on the
// same raw row. In a decode step every workgroup of a short row calls it (the q heads of one kv
// head get the same values), the group's first stores the row, and none reads row P from the
// caches: its key and value come from ks / vs. The writer form (OwnKvParams::writer, one
// workgroup per kv head and token) stores the rows of a verify step, and of a decode step whose
// row is attention_split's, before their attention reads them from the caches. Chunks keep
// qkv_norm_rope.
//
// Why not one prologue for q, k and v (one load round trip and three workgroup sums where this
// form has two prologues): built in session 32, and every shape of it that also serves verify
// steps' q crashed lavapipe (CI's Vulkan; "stack smashing detected" in its worker thread), while
// this one runs; the H200's measurement decides whether the merged form is worth another try.
//
// Binding 9: kvp: OwnKvParams. Workgroup memory: ks, vs (OWN_D = d floats each).

struct OwnKvParams {
    k_off: u32,
    v_off: u32,
    k_w: u32,
    writer: u32,
}

@group(0) @binding(9) var<uniform> kvp: OwnKvParams;

var<workgroup> ks: array<f32, {{OWN_D}}>;
var<workgroup> vs: array<f32, {{OWN_D}}>;

fn own_kv(t: u32, kvh: u32, lid: u32, write: bool) {
    let d = p.d;
    let half = d / 2u;
    let kb = t * qn.src_stride + kvp.k_off + kvh * d;
    let vb = t * qn.src_stride + kvp.v_off + kvh * d;
    let rb = t * qn.rope_stride + qn.rope_off;
    // @unroll k DK
    let i{k} = {k}u * WG + lid;
    var x{k} = 0.0;
    var y{k} = 0.0;
    var w{k} = 0.0;
    var c{k} = 1.0;
    var s{k} = 0.0;
    if (i{k} < d) {
        x{k} = q[kb + i{k}];
        y{k} = q[vb + i{k}];
        w{k} = wt[kvp.k_w + i{k}];
        c{k} = rope[rb + i{k} % half];
        s{k} = rope[rb + half + i{k} % half];
    }
    // @end k
    var sk = 0.0;
    var sv = 0.0;
    // @unroll k DK
    sk += x{k} * x{k};
    sv += y{k} * y{k};
    // @end k
    let rk = 1.0 / sqrt(workgroup_sum(sk, lid) / f32(d) + qn.eps);
    let rv = 1.0 / sqrt(workgroup_sum(sv, lid) / f32(d) + qn.eps);
    // @unroll k DK
    let n{k} = x{k} * rk * w{k};
    if (i{k} < d) {
        ks[i{k}] = n{k};
        vs[i{k}] = y{k} * rv;
    }
    // @end k
    workgroupBarrier();
    // @unroll k DK
    var o{k} = 0.0;
    if (i{k} < d) {
        if (i{k} < half) {
            o{k} = n{k} * c{k} - ks[i{k} + half] * s{k};
        } else {
            o{k} = n{k} * c{k} + ks[i{k} - half] * s{k};
        }
    }
    // @end k
    workgroupBarrier();
    // @unroll k DK
    if (i{k} < d) { ks[i{k}] = o{k}; }
    // @end k
    workgroupBarrier();
    if (write) {
        let d4 = d / 4u;
        let row = kv_row(step.pos0 + t, p.slots) * p.n_kv_heads * d4 + kvh * d4;
        for (var j = lid; j < d4; j += WG) {
            kc[row + j] = own_k(j);
            vc[row + j] = own_v(j);
        }
    }
}

// The own row's vec4 j of k / v (zero past the row, as the cache loads leave it).
fn own_k(j: u32) -> vec4<f32> {
    if (4u * j >= p.d) { return vec4<f32>(0.0); }
    return vec4<f32>(ks[4u * j], ks[4u * j + 1u], ks[4u * j + 2u], ks[4u * j + 3u]);
}

fn own_v(j: u32) -> vec4<f32> {
    if (4u * j >= p.d) { return vec4<f32>(0.0); }
    return vec4<f32>(vs[4u * j], vs[4u * j + 1u], vs[4u * j + 2u], vs[4u * j + 3u]);
}
