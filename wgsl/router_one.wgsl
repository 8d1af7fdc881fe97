// router_one: a MoE layer's 8-bit router (MLX affine, group gs) for decode and verify steps in
// one workgroup per token: the logits s[e] = Σ_k W[e, k] · x[t, k] of the n_experts × cols
// matrix W, then router_pick.wgsl's top-k pick (appended by the host where its PICK marker stands):
// one dispatch where those steps otherwise run two dependent ones (matmul_q8_t1 over n_experts
// workgroups, then router_topk on one), the router's bytes (the 26B's: 128 × 2816, 360 KB) read
// by one workgroup. Session 23 #2 built that fold on the generic load8 (two scalar word loads and
// a scale and a bias per 8 values, a rolled loop): one workgroup pulled ≈ 10 GB/s and it lost
// (39.5 µs against 12.2 + 10.1). Here each thread issues UG whole groups of weights at once as
// 16-byte loads (4 per group of 64, with the group's scale and bias): WG · UG · 64 bytes in flight
// per round trip (128 KiB at 1024 threads and UG 2).
// x is staged as [vec4 i of a group][group] (xs[i · groups + g]) with each group's sum of x
// beside it (xg): the lanes of a row take consecutive groups, so a warp's read of vec4 i touches
// consecutive vec4s (every bank once; the rows of a warp read the same ones, a broadcast). Row
// order (x's 16 vec4s of a group in a row) put the 8 lanes of a row on the same four banks:
// 8-way conflicts on ≈ 180 K vec4 reads a token, ≈ 25 µs at one SM's shared-memory rate.
//
// Bindings: w: W as vec4<u32> (16 values each, value j of a word at bits 8j); scales, biases:
//   bf16 pairs (formats/groups.wgsl, prepended); x: f32[count, x_stride] (the router's normed
//   input); scale: f32[n_experts] (per_expert_scale); idx: u32[count, top_k]; weight: f32[count,
//   top_k]; p: RouterOneParams; step: Step (count = step.n_tokens).
// Launch: WG threads per token; grid = (count, 1). `lanes` threads per expert row (a power of two,
//   lanes · n_experts ≤ WG; host-chosen), lane l summing the row's groups l, l + lanes, …, UG at a
//   time; then thread e < n_experts adds its row's lanes in lane order (a fixed order: decode and
//   verify give each token the same logits). Host guarantees: n_experts ≤ WG, gs == 64,
//   cols % 64 == 0, cols = 4 · XCAP4.
// The logits are not matmul_q8_t1's to the bit (another summation order), so decode and verify
// steps both take this kernel or neither (the host decides per model); chunks keep the mat-mat
// and router_topk.

const WG: u32 = {{WG}}u;
const UG: u32 = {{UG}}u;
const XCAP4: u32 = {{XCAP4}}u;

struct RouterOneParams {
    n_experts: u32,
    top_k: u32,
    cols: u32,
    gs: u32,
    x_stride: u32,
    lanes: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> scale: array<f32>;
@group(0) @binding(5) var<storage, read_write> idx: array<u32>;
@group(0) @binding(6) var<storage, read_write> weight: array<f32>;
@group(0) @binding(7) var<uniform> p: RouterOneParams;
@group(0) @binding(8) var<uniform> step: Step;

var<workgroup> xs: array<vec4<f32>, XCAP4>;
var<workgroup> xg: array<f32, XCAP4 / 16u>;
var<workgroup> part: array<f32, WG>;
var<workgroup> sc_all: array<f32, PICK_N>;

fn chosen_logit_scale(t: u32, c: u32) -> vec2<f32> {
    return vec2<f32>(sv[c], sc_all[c]);
}

// {{PICK}}

// Σ q·x over the 16 values of vec4 j (of 4) of group g's weights: x's vec4s 4j .. 4j + 3 of
// the group (`groups` groups in a row).
fn dot16(wv: vec4<u32>, g: u32, j: u32, groups: u32) -> f32 {
    let b = 4u * j * groups + g;
    return (dot(vec4<f32>(unpack4xU8(wv.x)), xs[b]) + dot(vec4<f32>(unpack4xU8(wv.y)), xs[b + groups]))
         + (dot(vec4<f32>(unpack4xU8(wv.z)), xs[b + 2u * groups]) + dot(vec4<f32>(unpack4xU8(wv.w)), xs[b + 3u * groups]));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    let lanes = p.lanes;
    let row = lid / lanes;
    let lane = lid % lanes;
    let groups = p.cols / 64u;
    // The expert scales travel with x: both are needed only after the loads below are issued.
    if (lid < p.n_experts) { sc_all[lid] = scale[lid]; }
    let xb = t * p.x_stride;
    // x's vec4 k (of group k / 16, its vec4 k % 16) to xs[(k % 16) · groups + k / 16].
    for (var k = lid; k < p.cols / 4u; k += WG) {
        xs[(k % 16u) * groups + k / 16u] = vec4<f32>(x[xb + 4u * k], x[xb + 4u * k + 1u], x[xb + 4u * k + 2u], x[xb + 4u * k + 3u]);
    }
    workgroupBarrier();
    // Each group's Σ x, once (the bias term's factor).
    for (var g = lid; g < groups; g += WG) {
        var v = vec4<f32>(0.0);
        for (var i = 0u; i < 16u; i++) { v += xs[i * groups + g]; }
        xg[g] = (v.x + v.y) + (v.z + v.w);
    }
    workgroupBarrier();
    var acc = 0.0;
    if (row < p.n_experts) {
        for (var g0 = lane; g0 < groups; g0 += lanes * UG) {
            // Every load of the round first: UG groups of 4 vec4s, their scales and biases.
            // @unroll u UG
            let g{u} = g0 + {u}u * lanes;
            let ok{u} = g{u} < groups;
            let gi{u} = row * groups + min(g{u}, groups - 1u);
            let a{u} = w[4u * gi{u}];
            let b{u} = w[4u * gi{u} + 1u];
            let c{u} = w[4u * gi{u} + 2u];
            let d{u} = w[4u * gi{u} + 3u];
            let s{u} = scale_at(gi{u});
            let z{u} = bias_at(gi{u});
            // @end u
            // @unroll u UG
            if (ok{u}) {
                let qx = (dot16(a{u}, g{u}, 0u, groups) + dot16(b{u}, g{u}, 1u, groups)) + (dot16(c{u}, g{u}, 2u, groups) + dot16(d{u}, g{u}, 3u, groups));
                acc += s{u} * qx + z{u} * xg[g{u}];
            }
            // @end u
        }
    }
    part[lid] = acc;
    workgroupBarrier();
    var s = 0.0;
    if (lid < p.n_experts) {
        for (var j = 0u; j < lanes; j++) { s += part[lid * lanes + j]; }
    }
    pick(lid, t, s);
}
