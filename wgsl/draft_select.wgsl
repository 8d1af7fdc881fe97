// draft_select: the MTP drafter's centroid head, pass 1 (spec §3.3): the top_k of the n_centroids
// centroid scores, then the clusters they pick — the token ids pass 2 scores.
//   chosen c_0..c_{k−1}: descending score, ties → the lower centroid (the reference's stable
//   descending sort), NaN ranks last;
//   sel[j · per + i] = order[c_j · per + i]   (per = vocab / n_centroids tokens per cluster).
//
// Bindings: scores: f32[n_centroids] (centroids · x̂); order: u32[vocab] (token_ordering,
//   cluster-major); sel: u32[top_k · per]; p: DraftHeadParams; step: Step (unused: the drafter
//   runs one token).
// Launch: one workgroup of WG (256) threads; grid = (1, 1). top_k rounds of a workgroup argmax
// over the centroids not yet taken (n_centroids ≤ MAX_C, host-checked): 32 rounds over 2048
// scores is a few microseconds, and the selection is exact (no approximate top-k).

const WG: u32 = 256u;
const MAX_C: u32 = 8192u;
const NEG: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> scores: array<f32>;
@group(0) @binding(1) var<storage, read> order: array<u32>;
@group(0) @binding(2) var<storage, read_write> sel: array<u32>;
@group(0) @binding(3) var<uniform> p: DraftHeadParams;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> taken: array<u32, MAX_C>;
var<workgroup> chosen: array<u32, 64>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    for (var c = lid; c < p.n_centroids; c += WG) { taken[c] = 0u; }
    workgroupBarrier();
    for (var r = 0u; r < p.top_k; r++) {
        var best_v = NEG;
        var best_i = 0xffffffffu;
        for (var c = lid; c < p.n_centroids; c += WG) {
            var v = scores[c];
            if (v != v) { v = NEG; } // NaN ranks last
            if (taken[c] == 0u && (v > best_v || (v == best_v && c < best_i))) { best_v = v; best_i = c; }
        }
        argmax_tree(best_v, best_i, lid);
        if (lid == 0u) {
            chosen[r] = bi[0];
            taken[bi[0]] = 1u;
        }
        workgroupBarrier();
    }
    for (var j = lid; j < p.top_k * p.per; j += WG) {
        let r = j / p.per;
        sel[j] = order[chosen[r] * p.per + (j - r * p.per)];
    }
}
