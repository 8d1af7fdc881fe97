// qmv_moe_glu: qmv_moe.wgsl for the fused gate_up expert stacks, with the GeGLU as epilogue:
// for token t, routed slot j (expert e = idx[t, j]) and r < rows,
//   y[(t * top_k + j) * y_stride + r] = gelu_tanh(G_e[r] · x) · U_e[r] · x,
//   G_e[r] = W[e * expert_stride + row_off + r], U_e[r] = W[e * expert_stride + up_off + r],
//   x = x[t * x_tok_stride + j * x_slot_stride ..]
// One dispatch instead of three (gate, up, gelu_mul) per MoE layer. A team owns PAIRS gate rows
// and the PAIRS up rows that pair with them (RPT = 2 · PAIRS rows of qmv_core.wgsl); each row's
// sum is the one qmv_moe computes for that row with the same LANES. SKIP pairs (e = 0xffffffff)
// are left untouched. gelu_tanh: gelu.wgsl.
//
// Bindings: those of qmv_moe.wgsl (p: MoeMatmulParams with up_off).
// Launch: 128 threads; workgroup (i, j, t) owns rows [TEAMS·PAIRS·i, …) of slot j of token t;
//   grid = (ceil(rows / (TEAMS·PAIRS)), top_k, n_tokens).
// Host guarantees: cols % 64 == 0, x_tok_stride % 4 == 0, x_slot_stride % 4 == 0.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: MoeMatmulParams;
@group(0) @binding(7) var<uniform> step: Step;

const PAIRS: u32 = {{PAIRS}}u;

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
    let r0 = (wid.x * TEAMS + lid / LANES) * PAIRS;
    var rows: array<u32, RPT>;
    // @unroll r PAIRS
    rows[{r}] = e * p.expert_stride + p.row_off + min(r0 + {r}u, p.rows - 1u);
    rows[PAIRS + {r}u] = e * p.expert_stride + p.up_off + min(r0 + {r}u, p.rows - 1u);
    // @end r
    var xrows: array<u32, TOK>;
    xrows[0] = (t * p.x_tok_stride + j * p.x_slot_stride) / 4u;
    qmv_reduce(qmv_dots(rows, xrows, lane, p.cols, p.gs), lid, lane);
    if (lane == 0u) {
        // @unroll r PAIRS
        if (r0 + {r}u < p.rows) {
            y[(t * p.top_k + j) * p.y_stride + r0 + {r}u] = gelu_tanh(red[{r}u * WG + lid]) * red[(PAIRS + {r}u) * WG + lid];
        }
        // @end r
    }
}
