// head_norm_rope: per token t and head h of a projection (q, k or v):
//   v = src[t, src_off + h*d .. src_off + h*d+d] (src_off: where this projection starts in a
//   row of stacked q | k | v);  v = norm(v) · w (w_off != NO_WEIGHT);  v = rope(v, pos0 + t) (rope == 1)
//   written to dst[t, h*d ..] (dst_mode 0: the q buffer) or to the KV cache slot of position
//   pos0 + t: dst[kv_row(pos0 + t, slots) * n_heads*d + h*d ..] (dst_mode 1; kv_row in common.wgsl).
// Norm and rope: head_norm_core.wgsl (appended by the host).
//
// Bindings: src: f32[n_tokens, src_stride]; wt: f32[..] norm weights; rope: f32 per-step table;
//   dst: f32; p: HeadParams; step: Step.
// Launch: WG threads per (head, token) (head_norm_core.wgsl; by default 256: a decode step has
// few heads, one pass over d ≤ 1024 rather than a loop of dependent loads); grid = (n_heads,
// n_tokens). Host guarantees d ≤ 4 · WG.

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

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let sb = t * p.src_stride + p.src_off + h * p.d;
    let v = head_values(sb, p.d, p.w_off, p.rope == 1u, t * p.rope_stride + p.rope_off, p.eps, lid);
    var db: u32;
    if (p.dst_mode == 1u) {
        db = kv_row(step.pos0 + t, p.slots) * (p.n_heads * p.d) + h * p.d;
    } else {
        db = t * (p.n_heads * p.d) + h * p.d;
    }
    // @unroll j 4
    if (lid + {j}u * WG < p.d) { dst[db + lid + {j}u * WG] = v[{j}]; }
    // @end j
}
