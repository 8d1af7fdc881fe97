// matmul: y[t, y_off + r] = Σ_k W[r, k] · x[t, k]   for rows r < rows, tokens t < count.
// One kernel for decode (count = 1) and prefill/verify (count = chunk): a token's result never
// depends on the other tokens in the step (fixed per-token reduction order), so the M = 1 and
// M = k+1 paths give bitwise-identical logits.
//
// Bindings: w, scales, biases: the weight in the format prepended from wgsl/formats/*.wgsl
//   (`load8` yields 8 consecutive values of a row); x: f32[count, x_stride];
//   y: f32[count, y_stride]; p: MatmulParams; step: Step.
// Launch: 64 threads; workgroup (i, j) owns rows [ROWS*i, ROWS*i+ROWS) × tokens [TOK*j, TOK*j+TOK).
//   grid = (ceil(rows / ROWS), ceil(count / TOK)); when ceil(rows / ROWS) exceeds the 65535
//   workgroups a dimension allows (the LM head: 262144 rows), the host folds it into x·z and
//   i = wid.x + wid.z · num_workgroups.x (blocks past the end find no rows).
// Each thread walks the 8-value chunks c8 = lid, lid+64, … of its rows, so one weight load serves
// TOK tokens; partial sums are then added in thread order (deterministic).
// When cols % 8 != 0 (float formats only: quantised rows are whole groups) every column goes
// through the element path `load1` instead, so rows of any length work.
// Host guarantees: for quantised formats cols % gs == 0.

// TOK and ROWS are substituted by the host (`matmul_rows`): decode steps use TOK = 1 (no wasted
// multiply-adds on absent tokens) and ROWS = 1 (the most workgroups: on the H200 a decode step
// is short of parallelism, ROWS 16 measured 2.4x slower and ROWS 1 1.3x faster than 4), prefill
// chunks TOK = 8, ROWS = 4 (each weight load serves 8 tokens). A token's arithmetic is the same
// sequence of operations in both.
const WG: u32 = 64u;
const ROWS: u32 = {{ROWS}}u;
const TOK: u32 = {{TOK}}u;



@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

var<workgroup> partial: array<f32, ROWS * TOK * WG>; // [ROWS * TOK][WG]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = (wid.x + wid.z * nwg.x) * ROWS;
    let t0 = wid.y * TOK;
    // Loops have constant trip counts and out-of-range rows/tokens are clamped (computed, never
    // stored) so the driver unrolls them and keeps `acc` in registers: a dynamically indexed
    // array would live in slow local memory.
    var acc: array<f32, ROWS * TOK>; // [ROWS][TOK]
    for (var i = 0u; i < ROWS * TOK; i++) { acc[i] = 0.0; }
    var rows: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) { rows[r] = min(r0 + r, p.rows - 1u); }
    var xrow: array<u32, TOK>;
    for (var t = 0u; t < TOK; t++) { xrow[t] = min(t0 + t, count - 1u) * p.x_stride; }
    let n8 = select(0u, p.cols / 8u, p.cols % 8u == 0u);
    for (var c8 = lid; c8 < n8; c8 += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let wv = load8(rows[r], c8, p.cols, p.gs);
            for (var t = 0u; t < TOK; t++) {
                let xb = xrow[t] + c8 * 8u;
                var s = 0.0;
                for (var j = 0u; j < 8u; j++) { s += wv[j] * x[xb + j]; }
                acc[r * TOK + t] += s;
            }
        }
    }
    for (var c = n8 * 8u + lid; c < p.cols; c += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let wv = load1(rows[r], c, p.cols, p.gs);
            for (var t = 0u; t < TOK; t++) {
                acc[r * TOK + t] += wv * x[xrow[t] + c];
            }
        }
    }
    for (var i = 0u; i < ROWS * TOK; i++) { partial[i * WG + lid] = acc[i]; }
    workgroupBarrier();
    if (lid < ROWS * TOK) {
        let r = lid / TOK;
        let t = lid % TOK;
        if (r0 + r < p.rows && t0 + t < count) {
            var s = 0.0;
            for (var k = 0u; k < WG; k++) { s += partial[lid * WG + k]; }
            y[(t0 + t) * p.y_stride + p.y_off + r0 + r] = s;
        }
    }
}
