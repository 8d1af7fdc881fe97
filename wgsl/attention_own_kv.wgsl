// attention_own_kv: attention_short.wgsl's own-row form for a KV-owning layer's decode and verify
// steps, in place of its qkv_norm_rope dispatch (PERF_NOTES.md, session 32): q is normed and
// rotated from the raw q | k | v row by attention_qnorm.wgsl's prologue, and the row's k and v
// here, so a decode step's short row has one dependent dispatch where it had two. Appended by
// the host after attention_short.wgsl and attention_qnorm.wgsl, which declare q (the raw rows),
// kc and vc (read-write in this form), p, step, qn, wt, rope, WG, DK and workgroup_sum.
//
// own_kv(t, kvh, lid, write, copy_row): for token t's position P = pos0 + t and kv head kvh,
//   k = rope(norm(x_k) · w_k), v = norm(x_v)   (v: no weight, no rope; x_v = x_k for K-as-V
//   layers, v_off = k_off), x_k at k_off + kvh·d and x_v at v_off + kvh·d in row t of q
//   (stride qn.src_stride), w_k at k_w in wt, q's rope row (qn.rope_off, rope_stride), eps qn.eps,
// into ks / vs (workgroup memory), then, when `write`, into the caches' row kv_row(P), and, unless
// copy_row is NO_ROW, into the caches' row copy_row too (this workgroup's own copy). The same
// products and rotate-half as head_norm_core.wgsl (not the same bits: another pipeline, another
// sum order). Every thread of the workgroup calls it (barriers).
//
// Why a cache row has the same bits whichever step wrote it (verify bitwise decode): every row a
// decode or verify step writes comes from the one call site of own_kv in attention_short.wgsl,
// in one pipeline (the writer form and the attention are two dispatches of one kernel), on the
// same raw row. In a decode step every workgroup of a short row calls it (the q heads of one kv
// head get the same values) and the group's first stores the row in the ring and reads it
// there (its own stores: its storageBarrier orders them); no other workgroup reads row P from
// the ring. Each other one stores its own copy in a staging row (kv_row's rows after the ring,
// unused by decode steps: row h % grp for q head h) and its loops read key P there (key_row
// selects the row, so no branch sits between the loads of a batch). The first build
// took key P from ks / vs through a branch around every load: on an H100 that form's dispatch
// was ≈ 7.6 µs slower than the plain kernel's where the q-norm form is 1.2 µs slower
// (PERF_NOTES.md, session 32 #3), and the branches are the likeliest cause. The writer form
// (OwnKvParams::writer, one workgroup per kv head and token) stores the rows of a verify step,
// and of a decode step whose row is attention_split's, before their attention reads them from
// the caches. Chunks keep qkv_norm_rope.
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

const NO_ROW: u32 = 0xffffffffu;

fn own_kv(t: u32, kvh: u32, lid: u32, write: bool, copy_row: u32) {
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
    if (write) { store_own(kv_row(step.pos0 + t, p.slots), kvh, lid); }
    if (copy_row != NO_ROW) { store_own(copy_row, kvh, lid); }
    // The stored rows are read back by other threads of this workgroup (the key and value loops).
    storageBarrier();
}

// ks / vs into kv head kvh's columns of the caches' row `row`.
fn store_own(row: u32, kvh: u32, lid: u32) {
    let d4 = p.d / 4u;
    let base = row * p.n_kv_heads * d4 + kvh * d4;
    for (var j = lid; j < d4; j += WG) {
        kc[base + j] = own_k(j);
        vc[base + j] = own_v(j);
    }
}

// The cache row attention_short's loops read for key position r: the workgroup's own copy of
// the decode step's row (`own_row`, staged by own_kv) for r == pos, else kv_row's. A select of
// the row, not a branch around the loads, so the loads of a batch stay in flight together.
fn key_row(r: u32, pos: u32, own_row: u32) -> u32 {
    return select(kv_row(r, p.slots), own_row, own_row != NO_ROW && r == pos);
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
