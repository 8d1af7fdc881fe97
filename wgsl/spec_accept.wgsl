// spec_accept: a speculative round's acceptance on the GPU, so the next round can be recorded and
// submitted before the host has read this one (greedy, as crate::engine::speculative accepts):
//   n = the longest prefix of drafts equal to the verify's argmax (d_j == best[j]), j < k;
//   next = best[n] (the target's own token after the accepted drafts); pos' = pos + n + 1.
// It writes the round state (spec_params.wgsl), both step uniforms' words for the next round
// (the host copies them into the uniforms: a shader cannot write a uniform) and the next token
// into both programs' ids.
//
// Bindings: drafts: u32[k] (the drafter's); best: u32[k + 1] (the verify's argmax); state:
//   u32[5] (k in [4]); steps: u32[16] (the target's verify Step: k + 1 tokens at pos', staged; then the
//   drafter's: one token at pos' − 1); ids: u32 (the target's, [0]); draft_ids: u32 (the
//   drafter's, [0]); p: SpecParams; step: Step (unused, bound for the shared prelude).
// Launch: one workgroup of 64 threads, thread 0 working (a handful of words); grid = (1, 1).

@group(0) @binding(0) var<storage, read> drafts: array<u32>;
@group(0) @binding(1) var<storage, read> best: array<u32>;
@group(0) @binding(2) var<storage, read_write> state: array<u32>;
@group(0) @binding(3) var<storage, read_write> steps: array<u32>;
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;
@group(0) @binding(5) var<storage, read_write> draft_ids: array<u32>;
@group(0) @binding(6) var<uniform> p: SpecParams;
@group(0) @binding(7) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    if (lid.x != 0u) { return; }
    let k = state[4];
    var n = 0u;
    while (n < k && drafts[n] == best[n]) { n++; }
    let pos = state[0];
    let next = best[n];
    let pos1 = pos + n + 1u;
    state[0] = pos1;
    state[1] = n;
    state[2] = pos;
    state[3] = next;
    // Step (common.wgsl): n_tokens, pos0, n_out, out_row0, staged, pad × 3.
    steps[0] = k + 1u; steps[1] = pos1; steps[2] = k + 1u; steps[3] = 0u; steps[4] = 1u;
    steps[5] = 0u; steps[6] = 0u; steps[7] = 0u;
    // The drafter's query at pos' runs its attention as a query at pos' − 1 (builder/drafter.rs).
    steps[8] = 1u; steps[9] = pos1 - 1u; steps[10] = 1u; steps[11] = 0u; steps[12] = 0u;
    steps[13] = 0u; steps[14] = 0u; steps[15] = 0u;
    ids[0] = next;
    draft_ids[0] = next;
}
