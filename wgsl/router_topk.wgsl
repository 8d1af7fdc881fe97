// router_topk: for each token t < step.n_tokens, over the n_experts router logits s[t, :]:
//   p = softmax(s) (f32), pick the top_k experts (largest p, ties → lower index), renormalise
//   their p to sum 1, and multiply by per_expert_scale[e]:
//   idx[t, j] = e_j, weight[t, j] = p_j / Σ p · per_expert_scale[e_j]   for j < top_k, j in
//   descending order of p (the order the combine adds them in). Softmax over all experts then
//   renormalising the top k equals softmax over the top-k logits (spec §2.2): the
//   max-subtracted exponentials of the k are enough, the full normaliser cancels.
//
// Bindings: logits: f32[n_tokens, n_experts]; scale: f32[n_experts] (per_expert_scale);
//   idx: u32[n_tokens, top_k]; weight: f32[n_tokens, top_k]; p: RouterParams; step: Step.
// Launch: WG (256) threads per token (one expert each; the backend refuses n_experts > WG);
//   grid = (n_tokens, 1).
// Each thread loads its expert's scale with its logit, and the k chosen experts' logits and
// scales come from workgroup memory, not from a second round of global loads after the ranking:
// one memory round trip fewer in a kernel that is a single workgroup's latency chain per token.
// A NaN logit ranks last and, chosen only when fewer than k logits are not NaN, weighs 0 (its
// staged value is −3e38).

const WG: u32 = {{WG}}u; // kernels::ROUTER_TOPK_WG
const NEG: f32 = -3.0e38;

struct RouterParams {
    n_experts: u32,
    top_k: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> scale: array<f32>;
@group(0) @binding(2) var<storage, read_write> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> weight: array<f32>;
@group(0) @binding(4) var<uniform> p: RouterParams;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> sc_all: array<f32, WG>; // each expert's scale

// The chosen expert c's logit and scale, for its weight.
fn chosen_logit_scale(t: u32, c: u32) -> vec2<f32> {
    return vec2<f32>(sv[c], sc_all[c]);
}

var<workgroup> chosen: array<u32, WG>;
var<workgroup> mx: f32;
var<workgroup> ex: array<f32, WG>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> sv: array<f32, WG>;

// pick(lid, t, s): thread lid < p.n_experts holds expert lid's logit s (others pass NEG);
// every thread of the workgroup calls it (barriers). Writes token t's top_k experts and weights.

fn pick(lid: u32, t: u32, s_in: f32) {
    let e = lid;
    var s = select(NEG, s_in, e < p.n_experts);
    // A NaN logit ranks last (it compares false both ways, so two experts could share a rank).
    // Tested on its bits: drivers may fold `s != s` to false (lavapipe did).
    s = select(s, NEG, (bitcast<u32>(s) & 0x7fffffffu) > 0x7f800000u);
    sv[lid] = s;
    workgroupBarrier();
    // Each expert's rank in the order (larger logit first, ties → lower index): the number of
    // experts ahead of it. Rank r < k is the r-th pick of k rounds of argmax over the experts
    // not yet chosen, in one pass and one barrier instead of k trees of barriers (10.9 µs per
    // MoE layer in the latency table, ledger: 2026-11-30 latency-table-warm; adopted in ledger:
    // 2026-12-01 router-topk-rank). Every other thread reads the
    // same sv[j] at once: a broadcast.
    if (e < p.n_experts) {
        var rank = 0u;
        for (var j = 0u; j < p.n_experts; j++) {
            let v = sv[j];
            rank += select(0u, 1u, v > s || (v == s && j < e));
        }
        if (rank < p.top_k) {
            chosen[rank] = e;
            if (rank == 0u) { mx = s; }
        }
    }
    workgroupBarrier();
    // The k weights: thread j < k takes its chosen expert's logit and scale (all k at once, not
    // one after another in a single thread), then every weight divides by the same sum, added in
    // j order.
    if (lid < p.top_k) {
        let ls = chosen_logit_scale(t, chosen[lid]);
        ex[lid] = exp(ls.x - mx);
        sc[lid] = ls.y;
    }
    workgroupBarrier();
    if (lid < p.top_k) {
        var z = 0.0;
        for (var j = 0u; j < p.top_k; j++) { z += ex[j]; }
        idx[t * p.top_k + lid] = chosen[lid];
        weight[t * p.top_k + lid] = ex[lid] / z * sc[lid];
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    var s = NEG;
    if (lid < p.n_experts) {
        s = logits[t * p.n_experts + lid];
        sc_all[lid] = scale[lid];
    }
    pick(lid, t, s);
}
