// head_norm_core: one head of a projection, normalised, scaled and rotated: the values both
// head_norm_rope.wgsl (one projection) and qkv_norm_rope.wgsl (stacked q | k | v) write.
// Appended by the host after the kernel, which declares `src`, `wt` and `rope` (f32 arrays).
//
// head_values(sb, d, w_off, rope_on, rope_base, eps, lid): for v = src[sb .. sb + d],
//   v = norm(v) · w (w at w_off; NO_WEIGHT: none);  v = rope(v) when rope_on,
// returns v[lid + j · WG] in component j (j < 4; 0 past d). Rope is rotate-half: pairs
// (i, i + d/2) rotate by the angle of frequency i, cos at rope[rope_base + i], sin at
// rope[rope_base + d/2 + i] (the per-step host table; frequencies past the rotated ones have
// cos 1, sin 0). Every thread of the workgroup must call it (barriers). d ≤ 4 · WG; WG a power
// of two (the tree below).
// WG (kernels::head_norm_wg): 128 where d ≤ 512 (each thread up to four values: a chunk's
// thousands of heads get fewer threads and barriers each; a chunk's qkv_norm_rope 0.57 → 0.44 ms
// on E4B, decode's the same: ledger: 2026-12-01 head-norm-wg128), 256 for wider heads; 64 (a
// kernel variant the tests run) was even in chunks (ledger: 2026-12-01 head-norm-wg64-chunk)
// and lost in decode (ledger: 2026-12-05 head-norm-wg64-short-wg256).
// Why the loads come first (ledger: 2026-11-30 latency-hygiene): a GPU issues in order, so a load
// then its use waits a round trip; the source, weights and table are all requested before the sum.

const WG: u32 = {{WG}}u;
const NO_WEIGHT: u32 = 0xffffffffu;

var<workgroup> red: array<f32, WG>;
var<workgroup> normed: array<f32, 1024>;

fn head_values(sb: u32, d: u32, w_off: u32, rope_on: bool, rope_base: u32, eps: f32, lid: u32) -> vec4<f32> {
    let half = d / 2u;
    var x = vec4<f32>(0.0);
    var w = vec4<f32>(1.0);
    var c = vec4<f32>(1.0);
    var s = vec4<f32>(0.0);
    // @unroll j 4
    if (lid + {j}u * WG < d) {
        let i = lid + {j}u * WG;
        x[{j}] = src[sb + i];
        if (w_off != NO_WEIGHT) { w[{j}] = wt[w_off + i]; }
        if (rope_on) {
            c[{j}] = rope[rope_base + i % half];
            s[{j}] = rope[rope_base + half + i % half];
        }
    }
    // @end j
    red[lid] = ((x[0] * x[0] + x[1] * x[1]) + x[2] * x[2]) + x[3] * x[3];
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) { red[lid] += red[lid + k]; }
        workgroupBarrier();
    }
    let r = 1.0 / sqrt(red[0] / f32(d) + eps);
    var n = vec4<f32>(0.0);
    // @unroll j 4
    if (lid + {j}u * WG < d) {
        var v = x[{j}] * r;
        if (w_off != NO_WEIGHT) { v *= w[{j}]; }
        n[{j}] = v;
        normed[lid + {j}u * WG] = v;
    }
    // @end j
    if (!rope_on) { return n; }
    workgroupBarrier();
    var out = vec4<f32>(0.0);
    // @unroll j 4
    if (lid + {j}u * WG < d) {
        let i = lid + {j}u * WG;
        if (i < half) {
            out[{j}] = n[{j}] * c[{j}] - normed[i + half] * s[{j}];
        } else {
            out[{j}] = n[{j}] * c[{j}] + normed[i - half] * s[{j}];
        }
    }
    // @end j
    return out;
}
