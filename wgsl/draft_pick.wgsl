// draft_pick: the MTP drafter's centroid head, pass 3: the draft token, the first maximum of the
// selected tokens' scores (larger score, or an equal score and a lower token id: the reference's
// argmax over the full logits, where unselected tokens hold min − 1). NaN never wins; with no
// number at all the draft is token 0.
//
// Bindings: score: f32[top_k · per]; sel: u32[top_k · per]; best: u32[1] (the draft);
//   p: DraftHeadParams; step: Step (unused).
// Launch: one workgroup of WG (256) threads; grid = (1, 1).

const WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> score: array<f32>;
@group(0) @binding(1) var<storage, read> sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> best: array<u32>;
@group(0) @binding(3) var<uniform> p: DraftHeadParams;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var best_v = -3.0e38;
    var best_i = 0xffffffffu;
    for (var j = lid; j < p.top_k * p.per; j += WG) {
        let v = score[j];
        let i = sel[j];
        if (v > best_v || (v == best_v && i < best_i)) { best_v = v; best_i = i; }
    }
    argmax_tree(best_v, best_i, lid);
    // All NaN: token 0, as the reference's argmax of a row with no number.
    if (lid == 0u) { best[0] = select(bi[0], 0u, bi[0] == 0xffffffffu); }
}
