// head_norm_rope: per token t and head h of a projection (q, k or v):
//   v = src[t, src_off + h*d .. src_off + h*d+d] (src_off: where this projection starts in a
//   row of stacked q | k | v);  v = norm(v) · w (w_off != NO_WEIGHT);  v = rope(v, pos0 + t) (rope == 1)
//   written to dst[t, h*d ..] (dst_mode 0: the q buffer) or to the KV cache slot of position
//   pos0 + t: dst[kv_row(pos0 + t, slots) * n_heads*d + h*d ..] (dst_mode 1; kv_row in common.wgsl).
// Rope is rotate-half: pairs (i, i + d/2) rotate by the angle of frequency i. cos/sin come from
// the per-step table computed on the host exactly as transformers does (f32 angle = pos · inv_freq),
// since GPU cos/sin of large angles are not accurate enough: rope[t * rope_stride + rope_off + i]
// holds cos_i and [.. + d/2 + i] sin_i; frequencies past the rotated ones have cos 1, sin 0.
//
// Bindings: src: f32[n_tokens, src_stride]; wt: f32[..] norm weights; rope: f32 per-step table;
//   dst: f32; p: HeadParams; step: Step.
// Launch: 256 threads per (head, token) (a decode step has few heads: one pass over d ≤ 512
// rather than a loop of dependent loads); grid = (n_heads, n_tokens). Host guarantees d ≤ 1024.

const WG: u32 = 256u;
const NO_WEIGHT: u32 = 0xffffffffu;

struct HeadParams {
    d: u32,
    n_heads: u32,
    src_stride: u32,
    w_off: u32,
    rope: u32,
    rope_off: u32,
    rope_stride: u32,
    dst_mode: u32,
    slots: u32,
    eps: f32,
    src_off: u32,
    _pad1: u32,
}


@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> wt: array<f32>;
@group(0) @binding(2) var<storage, read> rope: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<uniform> p: HeadParams;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> red: array<f32, WG>;
var<workgroup> normed: array<f32, 1024>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let sb = t * p.src_stride + p.src_off + h * p.d;
    var ss = 0.0;
    for (var i = lid; i < p.d; i += WG) { let v = src[sb + i]; ss += v * v; }
    red[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    let r = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var i = lid; i < p.d; i += WG) {
        var v = src[sb + i] * r;
        if (p.w_off != NO_WEIGHT) { v *= wt[p.w_off + i]; }
        normed[i] = v;
    }
    workgroupBarrier();
    var db: u32;
    if (p.dst_mode == 1u) {
        db = kv_row(step.pos0 + t, p.slots) * (p.n_heads * p.d) + h * p.d;
    } else {
        db = t * (p.n_heads * p.d) + h * p.d;
    }
    let half = p.d / 2u;
    for (var i = lid; i < p.d; i += WG) {
        var v = normed[i];
        if (p.rope == 1u) {
            let j = i % half;
            let c = rope[t * p.rope_stride + p.rope_off + j];
            let sn = rope[t * p.rope_stride + p.rope_off + half + j];
            if (i < half) {
                v = normed[i] * c - normed[i + half] * sn;
            } else {
                v = normed[i] * c + normed[i - half] * sn;
            }
        }
        dst[db + i] = v;
    }
}
