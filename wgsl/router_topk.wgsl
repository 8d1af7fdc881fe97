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
//   grid = (n_tokens, 1). The choice itself is router_pick.wgsl's `pick` (the host appends it),
//   which route_norm.wgsl shares.
// STAGED (the host's choice, kernels::router_staged): each thread loads its expert's scale with
// its logit, and the k chosen experts' logits and scales come from workgroup memory, not from a
// second round of global loads after the ranking: one memory round trip fewer in a kernel that is
// a single workgroup's latency chain per token. The same arithmetic on the same values, so the
// same bits, but for NaN logits: one is chosen only when fewer than k logits are not NaN, and
// then the staged form weighs it 0 (its sv is −3e38) where the plain form gives NaN weights.

const WG: u32 = {{WG}}u; // kernels::ROUTER_TOPK_WG
const STAGED: bool = {{STAGED}};

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

// router_pick.wgsl's interface (it is appended by the host).
fn pick_n() -> u32 { return p.n_experts; }
fn pick_k() -> u32 { return p.top_k; }

// The chosen expert c's logit and scale, for its weight.
fn chosen_logit_scale(t: u32, c: u32) -> vec2<f32> {
    if (STAGED) { return vec2<f32>(sv[c], sc_all[c]); }
    return vec2<f32>(logits[t * p.n_experts + c], scale[c]);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.x;
    if (t >= step.n_tokens) { return; }
    var s = NEG;
    if (lid < p.n_experts) {
        s = logits[t * p.n_experts + lid];
        if (STAGED) { sc_all[lid] = scale[lid]; }
    }
    pick(lid, t, s);
}
