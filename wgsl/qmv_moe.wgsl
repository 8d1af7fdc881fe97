// qmv_moe: the routed-expert mat-vec of decode and verify steps on 4-bit experts, with the
// loop of qmv.wgsl (qmv_core.wgsl, appended by the host): for token t, routed slot j (expert
// e = idx[t, j]) and row r < rows:
//   y[(t * top_k + j) * y_stride + r] = Σ_c W[e * expert_stride + row_off + r, c] · x[t * x_tok_stride + j * x_slot_stride + c]
// Same contract as moe_matmul.wgsl (which it replaces for 4-bit experts): `e` is the expert, or
// the cache slot holding it when experts stream; e = 0xffffffff (SKIP) marks a pair of another
// round, left untouched.
// The GeGLU form (qmv_moe_glu: GLU = PAIRS > 0) reads a fused gate_up stack: gate row r at
// row_off + r, up row r at up_off + r of each expert, and writes
//   y[(t * top_k + j) * y_stride + r] = gelu_tanh(gate · x) · (up · x)
// one dispatch instead of three (gate, up, gelu_mul) per MoE layer (gelu_tanh: gelu.wgsl).
//
// Bindings: w: 4-bit experts stacked along rows, read as vec4<u32>; scales, biases: bf16 pairs;
//   idx: u32[n_tokens, top_k]; x: f32 read as vec4<f32>; y: f32[n_tokens * top_k, y_stride];
//   p: MoeMatmulParams (moe_params.wgsl); step: Step.
// Launch: 128 threads (TOK = 1); workgroup (i, j, t) owns output rows [TEAMS·OWN·i, …) of slot j
//   of token t (OWN = RPT, or PAIRS gate/up pairs with RPT = 2 · PAIRS); grid =
//   (ceil(rows / (TEAMS·OWN)), top_k, n_tokens).
// Host guarantees: cols % 64 == 0, x_tok_stride % 4 == 0, x_slot_stride % 4 == 0; in the
//   DIGITS form (qmv_digits.wgsl appended) cols = 4 · N4.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;

fn xload(i: u32) -> vec4<f32> { return x[i]; }
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;

const OWN: u32 = {{OWN}}u;

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let t = wid.z;
    let j = wid.y;
    // Uniform per workgroup, so returning before the barriers of qmv_reduce is safe.
    if (t >= step.n_tokens) { return; }
    let e = idx[t * p.top_k + j];
    if (e == 0xffffffffu) { return; }
    let r0 = (wid.x * TEAMS + lid / LANES) * OWN;
    var rows: array<u32, RPT>;
    // @unroll r OWN
    rows[{r}] = e * p.expert_stride + p.row_off + min(r0 + {r}u, p.rows - 1u);
    // @end r
    // @unroll r GLU
    rows[OWN + {r}u] = e * p.expert_stride + p.up_off + min(r0 + {r}u, p.rows - 1u);
    // @end r
    var xrows: array<u32, TOK>;
    xrows[0] = (t * p.x_tok_stride + j * p.x_slot_stride) / 4u;
    var dots: array<f32, RPT * TOK>;
    if (DIGITS) {
        // The slot's x as integer digits in workgroup memory (qmv_digits.wgsl: the loop's
        // arithmetic at about a third of the float loop's).
        stage_x_digits(lid, xrows[0]);
        var drows: array<u32, TOK>; // token 0's digits from xw[0]
        dots = qmv_dots_digits(rows, drows, lane, lid, p.cols, p.gs);
    } else {
        dots = qmv_dots(rows, xrows, lane, p.cols, p.gs);
    }
    qmv_reduce(dots, lid, lane);
    if (lane == 0u) {
        // @unroll r PLAIN
        if (r0 + {r}u < p.rows) { y[(t * p.top_k + j) * p.y_stride + r0 + {r}u] = red[{r}u * WG + lid]; }
        // @end r
        // @unroll r GLU
        if (r0 + {r}u < p.rows) {
            y[(t * p.top_k + j) * p.y_stride + r0 + {r}u] = gelu_tanh(red[{r}u * WG + lid]) * red[(OWN + {r}u) * WG + lid];
        }
        // @end r
    }
}
