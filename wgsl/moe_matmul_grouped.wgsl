// moe_matmul_grouped: the prefill form of moe_matmul. Workgroup (i, s) takes expert (or slot) s's
// routed pairs from moe_group's list and computes, for each pair p = t * top_k + j of it,
//   y[p * y_stride + r] = Σ_c W[s * expert_stride + row_off + r, c] · x[t * x_tok_stride + j * x_slot_stride + c]
// for rows r in [ROWS*i, ROWS*i+ROWS), TOK pairs at a time: every weight load serves TOK tokens,
// and the expert's rows are read from memory once per chunk (later batches of the same tile hit
// cache), not once per pair.
// Per pair, the arithmetic is moe_matmul's exactly (the same lane chunking, the same 8-term
// sums, the same reduction tree), so prefill and decode give bitwise-identical expert outputs.
//
// Bindings: w, scales, biases (format prepended: `load8`, `load1`); groups: moe_group's lists
//   (group s at s * group_stride); x: f32; y: f32[n_tokens * top_k, y_stride];
//   p: MoeMatmulParams (moe_params.wgsl); step: Step.
// Launch: 64 threads; grid = (ceil(rows / ROWS), n_groups, 1); empty groups return at once.

const WG: u32 = 64u;
const ROWS: u32 = 4u;
const TOK: u32 = 8u;


@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;

var<workgroup> partial: array<f32, ROWS * TOK * WG>; // [ROWS * TOK][WG]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let s = wid.y;
    let gbase = s * p.group_stride;
    let count = groups[gbase];
    if (count == 0u) { return; }
    let r0 = wid.x * ROWS;
    var rows: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) { rows[r] = s * p.expert_stride + p.row_off + min(r0 + r, p.rows - 1u); }
    let n8 = select(0u, p.cols / 8u, p.cols % 8u == 0u);
    for (var b = 0u; b < count; b += TOK) {
        // Pairs of this batch (the last one repeated past the end: computed, never stored).
        var pair: array<u32, TOK>;
        var xb: array<u32, TOK>;
        for (var t = 0u; t < TOK; t++) {
            let pp = groups[gbase + 1u + min(b + t, count - 1u)];
            pair[t] = pp;
            xb[t] = (pp / p.top_k) * p.x_tok_stride + (pp % p.top_k) * p.x_slot_stride;
        }
        var acc: array<f32, ROWS * TOK>; // [ROWS][TOK]
        for (var i = 0u; i < ROWS * TOK; i++) { acc[i] = 0.0; }
        for (var c8 = lid; c8 < n8; c8 += WG) {
            // The batch's inputs once per chunk, not once per row (as in matmul.wgsl).
            var xv: array<f32, TOK * 8>;
            for (var t = 0u; t < TOK; t++) {
                let xo = xb[t] + c8 * 8u;
                for (var k = 0u; k < 8u; k++) { xv[t * 8u + k] = x[xo + k]; }
            }
            for (var r = 0u; r < ROWS; r++) {
                let wv = load8(rows[r], c8, p.cols, p.gs);
                for (var t = 0u; t < TOK; t++) {
                    var sum = 0.0;
                    for (var k = 0u; k < 8u; k++) { sum += wv[k] * xv[t * 8u + k]; }
                    acc[r * TOK + t] += sum;
                }
            }
        }
        for (var c = n8 * 8u + lid; c < p.cols; c += WG) {
            for (var r = 0u; r < ROWS; r++) {
                let wv = load1(rows[r], c, p.cols, p.gs);
                for (var t = 0u; t < TOK; t++) { acc[r * TOK + t] += wv * x[xb[t] + c]; }
            }
        }
        for (var i = 0u; i < ROWS * TOK; i++) { partial[i * WG + lid] = acc[i]; }
        workgroupBarrier();
        // moe_matmul's reduction tree, for each (row, pair).
        for (var st = WG / 2u; st > 0u; st >>= 1u) {
            if (lid < st) {
                for (var i = 0u; i < ROWS * TOK; i++) { partial[i * WG + lid] += partial[i * WG + lid + st]; }
            }
            workgroupBarrier();
        }
        if (lid < ROWS * TOK) {
            let r = lid / TOK;
            let t = lid % TOK;
            if (r0 + r < p.rows && b + t < count) {
                y[pair[t] * p.y_stride + r0 + r] = partial[lid * WG];
            }
        }
        workgroupBarrier();
    }
}
