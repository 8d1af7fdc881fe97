// moe_matmul: for token t, routed slot j (expert e = idx[t, j]) and row r < rows:
//   y[(t * top_k + j) * y_stride + r] = Σ_c W[e * expert_stride + row_off + r, c] · x[t * x_tok_stride + j * x_slot_stride + c]
// `e` indexes the rows of `w`: the expert itself when every expert is resident, or the cache
// slot holding it when experts stream (slots have the same per-expert layout); e = 0xffffffff
// (SKIP) marks a pair computed in another round of a streamed step, which is left untouched.
// The experts of a layer are one matrix with experts stacked along rows: MLX's split
// gate/up/down ([E, out, in]: expert_stride = out, row_off = 0) and HF's fused gate_up
// ([E, 2I, H]: expert_stride = 2I, row_off 0 for gate, I for up) use the same kernel.
// Expert inputs: the shared normed hidden (x_slot_stride = 0) for gate/up, each slot's own
// activation (x_slot_stride = I) for down.
//
// Bindings: w, scales, biases (format prepended: `load8`, `load1`); idx: u32[n_tokens, top_k];
//   x: f32; y: f32[n_tokens * top_k, y_stride]; p: MoeMatmulParams (moe_params.wgsl); step: Step.
// Launch: 64 threads; workgroup (i, j, t) owns rows [4i, 4i+4) of slot j of token t;
//   grid = (ceil(rows / 4), top_k, n_tokens). Same per-lane chunking and fixed reduction tree
//   order as matmul.wgsl.

const WG: u32 = 64u;
const ROWS: u32 = 4u;



@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;

var<workgroup> partial: array<f32, ROWS * WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.z;
    let j = wid.y;
    if (t >= step.n_tokens) { return; }
    let e = idx[t * p.top_k + j];
    if (e == 0xffffffffu) { return; }
    let r0 = wid.x * ROWS;
    var rows: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) { rows[r] = e * p.expert_stride + p.row_off + min(r0 + r, p.rows - 1u); }
    let xb0 = t * p.x_tok_stride + j * p.x_slot_stride;
    var acc: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) { acc[r] = 0.0; }
    let n8 = select(0u, p.cols / 8u, p.cols % 8u == 0u);
    for (var c8 = lid; c8 < n8; c8 += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let wv = load8(rows[r], c8, p.cols, p.gs);
            let xb = xb0 + c8 * 8u;
            var s = 0.0;
            for (var k = 0u; k < 8u; k++) { s += wv[k] * x[xb + k]; }
            acc[r] += s;
        }
    }
    for (var c = n8 * 8u + lid; c < p.cols; c += WG) {
        for (var r = 0u; r < ROWS; r++) { acc[r] += load1(rows[r], c, p.cols, p.gs) * x[xb0 + c]; }
    }
    for (var r = 0u; r < ROWS; r++) { partial[r * WG + lid] = acc[r]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var r = 0u; r < ROWS; r++) { partial[r * WG + lid] += partial[r * WG + lid + s]; }
        }
        workgroupBarrier();
    }
    if (lid < ROWS && r0 + lid < p.rows) {
        y[(t * p.top_k + j) * p.y_stride + r0 + lid] = partial[lid * WG];
    }
}
