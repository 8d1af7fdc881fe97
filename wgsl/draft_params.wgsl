// draft_params: the params struct of the MTP drafter's centroid head (draft_select.wgsl,
// draft_score.wgsl, draft_pick.wgsl; prepended by the host; mirrors `DraftHeadParams` in
// kernels/params.rs).

struct DraftHeadParams {
    n_centroids: u32,
    top_k: u32,
    per: u32,     // tokens per cluster: vocab / n_centroids
    cols: u32,    // the drafter's hidden size
    gs: u32,      // the embedding's quantisation group (0 for float formats)
    row0: u32,    // this dispatch's part of the embedding
    rows: u32,
    _pad0: u32,
}
