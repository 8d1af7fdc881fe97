// router_pick: the top-k choice and weights of the MoE router from each expert's logit, for
// router_topk.wgsl (appended by the host where its PICK marker stands; the kernel declares p
// (n_experts, top_k), scale, idx, weight, sc_all and chosen_logit_scale). Its own file because
// a second kernel shared it (session 29's router_one, removed after it lost in session 30:
// tools/experiments/router-one.patch).
// pick(lid, t, s): thread lid < p.n_experts holds expert lid's logit s (others pass anything);
// every thread of the workgroup calls it (barriers). Writes token t's top_k experts (largest p,
// ties → lower index), in descending order of p, and their weights
//   weight[t, j] = p_j / Σ p · per_expert_scale[e_j]
// (softmax over all experts then renormalising the top k equals softmax over the top-k logits,
// spec §2.2; the max-subtracted exponentials are enough, the full normaliser cancels).
// The workgroup has at least n_experts threads; PICK_N (host-substituted) ≥ n_experts.

const NEG: f32 = -3.0e38;
const PICK_N: u32 = {{PICK_N}}u;

var<workgroup> chosen: array<u32, PICK_N>;
var<workgroup> mx: f32;
var<workgroup> ex: array<f32, PICK_N>;
var<workgroup> sc: array<f32, PICK_N>;
var<workgroup> sv: array<f32, PICK_N>;

fn pick(lid: u32, t: u32, s_in: f32) {
    let e = lid;
    var s = select(NEG, s_in, e < p.n_experts);
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
