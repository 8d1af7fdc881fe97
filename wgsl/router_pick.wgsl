// router_pick: a token's top-k experts and their weights from its router logits, one
// workgroup per token (router_topk.wgsl's definition: softmax, the k largest, renormalised, times
// the per-expert scale). Shared by router_topk.wgsl and route_norm.wgsl, which the host joins
// with it; the including kernel declares `idx` (u32) and `weight` (f32) storage arrays,
// `pick_n()` and `pick_k()` (experts and k, k ≤ experts ≤ PICK_N ≤ its WG threads) and
// `chosen_logit_scale(t, c)` (expert c's logit and per-expert scale, for its weight).

const PICK_N: u32 = 256u; // kernels::ROUTER_TOPK_WG: the most experts a router may have
const NEG: f32 = -3.0e38;

var<workgroup> sc_all: array<f32, PICK_N>; // staged forms: each expert's scale
var<workgroup> chosen: array<u32, PICK_N>;
var<workgroup> mx: f32;
var<workgroup> ex: array<f32, PICK_N>;
var<workgroup> sc: array<f32, PICK_N>;
var<workgroup> sv: array<f32, PICK_N>;

// pick(lid, t, s): thread lid < pick_n() holds expert lid's logit s (others pass NEG);
// every thread of the workgroup calls it (barriers). Writes token t's top_k experts and weights.
fn pick(lid: u32, t: u32, s_in: f32) {
    let e = lid;
    var s = select(NEG, s_in, e < pick_n());
    // A NaN logit ranks last (it compares false both ways, so two experts could share a rank).
    // Tested on its bits: drivers may fold `s != s` to false (lavapipe did).
    s = select(s, NEG, (bitcast<u32>(s) & 0x7fffffffu) > 0x7f800000u);
    if (lid < PICK_N) { sv[lid] = s; }
    workgroupBarrier();
    // Each expert's rank in the order (larger logit first, ties → lower index): the number of
    // experts ahead of it. Rank r < k is the r-th pick of k rounds of argmax over the experts
    // not yet chosen, in one pass and one barrier instead of k trees of barriers (10.9 µs per
    // MoE layer in the latency table of PERF_NOTES.md, session 6). Every other thread reads the
    // same sv[j] at once: a broadcast.
    if (e < pick_n()) {
        var rank = 0u;
        for (var j = 0u; j < pick_n(); j++) {
            let v = sv[j];
            rank += select(0u, 1u, v > s || (v == s && j < e));
        }
        if (rank < pick_k()) {
            chosen[rank] = e;
            if (rank == 0u) { mx = s; }
        }
    }
    workgroupBarrier();
    // The k weights: thread j < k takes its chosen expert's logit and scale (all k at once, not
    // one after another in a single thread), then every weight divides by the same sum, added in
    // j order.
    if (lid < pick_k()) {
        let ls = chosen_logit_scale(t, chosen[lid]);
        ex[lid] = exp(ls.x - mx);
        sc[lid] = ls.y;
    }
    workgroupBarrier();
    if (lid < pick_k()) {
        var z = 0.0;
        for (var j = 0u; j < pick_k(); j++) { z += ex[j]; }
        idx[t * pick_k() + lid] = chosen[lid];
        weight[t * pick_k() + lid] = ex[lid] / z * sc[lid];
    }
}

