// route_norm: a MoE layer's post-attention residual norm and its router in one decode / verify
// dispatch: rmsnorm.wgsl's mode 2 chained to the pre-MLP, router and pre-expert norms (out,
// out2, out3, out4, exactly that kernel's values), then the router's projection of the third
// output, logits[t, e] = Σ_k R[e, k] · out3[t, k] (matmul.wgsl's decode arithmetic, in its
// order), then router_topk.wgsl's top-k and weights (router_pick.wgsl, its staged form) into
// idx and weight. The host appends this file to rmsnorm.wgsl (ROUTE blocks expanded) with the
// router's weight format (load8) and router_pick.wgsl.
//
// Why one dispatch (PERF_NOTES.md, session 35): in a decode step the norm, the router mat-vec
// and the top-k were three dependent dispatches of almost no work each; left out of the 26B's
// step, the router mat-vec alone took 9.7 µs a layer. Here each workgroup computes the whole
// norm (the row is 2816 values, read from L2), owns a few router rows, and the workgroup that
// arrives last ranks the logits (last_workgroup.wgsl's hand-off: the logits pass through
// atomics, which session 21 found never stale where plain stores were).
// Measured (H100): the dispatch is 27 µs timestamped against ≈ 36 for the three, yet the 26B's
// step grew 9.5 %, so the backend leaves it off (`WgpuOptions::route_norm`) until the
// difference is understood. Not the weights held in registers across the norm, the hand-off,
// or how many workgroups share the router rows (RROWS): with the loads after the norm, without
// the hand-off, or at 64 and 128 workgroups, the step lost as much (session 37).
//
// Bindings 0–10: rmsnorm.wgsl's (NormParams at 6, Step at 7); 11–13 w, scales, biases: the
// router's weight in the format prepended (`load8`), rows = n_experts, cols = n (rp.cols);
// 14 logits: atomic u32[n_tokens, n_experts], each logit's f32 bits; 15 counter: atomic
// u32[n_tokens], all 0 between dispatches (the last workgroup of a token resets its own);
// 16 scale: f32[n_experts] (per_expert_scale); 17 idx: u32[n_tokens, top_k]; 18 weight:
// f32[n_tokens, top_k]; 19 rp: RouteParams.
// Launch: rmsnorm's WG threads, RLANES per router row (RROWS ≤ WG / RLANES rows a workgroup),
// each holding RC (host: ceil(cols / 8 / RLANES)) chunks of 8 weights; grid = (ceil(n_experts /
// RROWS), n_tokens). Host-checked: segs 1, mode 2, chain 3, n ≤ V · WG (no
// loop past the registers), cols = n a multiple of gs, n_experts ≤ PICK_N.

struct RouteParams {
    n_experts: u32,
    top_k: u32,
    cols: u32,
    gs: u32,
}

@group(0) @binding(11) var<storage, read> w: array<u32>;
@group(0) @binding(12) var<storage, read> scales: array<u32>;
@group(0) @binding(13) var<storage, read> biases: array<u32>;
@group(0) @binding(14) var<storage, read_write> logits: array<atomic<u32>>;
@group(0) @binding(15) var<storage, read_write> counter: array<atomic<u32>>;
@group(0) @binding(16) var<storage, read> scale: array<f32>;
@group(0) @binding(17) var<storage, read_write> idx: array<u32>;
@group(0) @binding(18) var<storage, read_write> weight: array<f32>;
@group(0) @binding(19) var<uniform> rp: RouteParams;

const RLANES: u32 = {{RLANES}}u; // kernels::ROUTE_LANES: matmul.wgsl's WG, its partial sums in its order
// Router rows a workgroup owns (kernels::route_norm_rows): WG / RLANES, or fewer to spread the
// rows over more workgroups; the threads past RROWS · RLANES repeat the workgroup's last row's
// loads (their logit is never stored).
const RROWS: u32 = {{RROWS}}u;

var<workgroup> rpart: array<f32, WG>;
var<workgroup> arrived_last: u32;

// router_pick.wgsl's interface (the staged form: logits and scales from workgroup memory).
fn pick_n() -> u32 { return rp.n_experts; }
fn pick_k() -> u32 { return rp.top_k; }
fn chosen_logit_scale(t: u32, c: u32) -> vec2<f32> { return vec2<f32>(sv[c], sc_all[c]); }

// Adds the RLANES partials of each row (lane 0, in lane order: matmul.wgsl's sum), hands the
// logits to the workgroup that arrives last, and there ranks them. Every thread calls it.
fn route_finish(lid: u32, t: u32, part: u32, parts: u32, acc: f32) {
    rpart[lid] = acc;
    workgroupBarrier();
    let row = part * RROWS + lid / RLANES;
    if (lid % RLANES == 0u && lid / RLANES < RROWS && row < rp.n_experts) {
        var s = 0.0;
        for (var k = 0u; k < RLANES; k++) { s += rpart[lid + k]; }
        atomicStore(&logits[t * rp.n_experts + row], bitcast<u32>(s));
    }
    storageBarrier();
    if (lid == 0u) { arrived_last = select(0u, 1u, atomicAdd(&counter[t], 1u) == parts - 1u); }
    if (workgroupUniformLoad(&arrived_last) == 0u) { return; }
    storageBarrier();
    var s = NEG;
    if (lid < rp.n_experts) {
        s = bitcast<f32>(atomicLoad(&logits[t * rp.n_experts + lid]));
        sc_all[lid] = scale[lid];
    }
    pick(lid, t, s);
    if (lid == 0u) { atomicStore(&counter[t], 0u); }
}
