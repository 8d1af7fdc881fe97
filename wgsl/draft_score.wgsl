// draft_score: the MTP drafter's centroid head, pass 2: each selected token's logit against the
// drafter's tied embedding, for the tokens in this part of the table (rows [row0, row0 + rows));
//   score[j] = Σ_c E[sel[j], c] · x[c]   (f32 sums; j < top_k · per)
// and pass 3 (`pick` below, its own kernel): the first maximum — the largest score, ties → the
// lower token id, which is the reference's first index of the maximum over the full logits
// (every unselected token holds min − 1 there).
//
// Bindings (score): w, scales, biases: one row-range part of the embedding, format prepended
//   (`load8`); sel: u32[top_k · per]; x: f32[cols] (the final-normed drafter hidden);
//   score: f32[top_k · per]; p: DraftHeadParams; step: Step (unused).
// Launch: 64 threads per selected token, each an 8-value chunk at a time; grid = (top_k · per, 1)
//   (≤ 64 · 2048 workgroups, host-checked). A tree sums the 64 partials in a fixed order.

const WG: u32 = 64u;

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> sel: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> score: array<f32>;
@group(0) @binding(6) var<uniform> p: DraftHeadParams;
@group(0) @binding(7) var<uniform> step: Step;

var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let j = wid.x;
    let id = sel[j];
    // Another part's token: that part's dispatch scores it. (No early return: the tree's
    // barriers must be reached by every thread.)
    let inside = id >= p.row0 && id < p.row0 + p.rows;
    let row = select(0u, id - p.row0, inside);
    var acc = 0.0;
    if (!inside) {
    } else if (p.cols % 8u == 0u) {
        for (var c8 = lid; c8 * 8u < p.cols; c8 += WG) {
            let v = load8(row, c8, p.cols, p.gs);
            for (var i = 0u; i < 8u; i++) { acc += v[i] * x[c8 * 8u + i]; }
        }
    } else {
        for (var c = lid; c < p.cols; c += WG) { acc += load1(row, c, p.cols, p.gs) * x[c]; }
    }
    part[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { part[lid] += part[lid + s]; }
        workgroupBarrier();
    }
    if (lid == 0u && inside) { score[j] = part[0]; }
}
