// qmv_glu: the decode/verify mat-vec of a stacked [gate; up] 4-bit matrix (2·rows rows: gate
// rows 0..rows, up rows rows..2·rows) with GeGLU as its epilogue:
//   y[t, y_off + r] = gelu_tanh(Σ_k G[r, k] · x[t, k]) · Σ_k U[r, k] · x[t, k]
// for r < rows, tokens t < count. One dispatch instead of three (gate, up, gelu_mul) per MLP.
//
// Bindings: those of qmv.wgsl (w, scales, biases of the stacked matrix; x; y; p: MatmulParams
//   with rows = the gate's rows; step).
// Launch: 128 threads = TEAMS teams of LANES lanes; a team owns PAIRS output rows, i.e. its
//   PAIRS gate rows and the PAIRS up rows below them (RPT = 2 · PAIRS rows of qmv_core);
//   grid = (ceil(rows / (TEAMS * PAIRS)), ceil(count / TOK)), x folded into x·z past 65535.
// Host guarantees: as qmv.wgsl. A gate or up row's sum is computed exactly as qmv computes that
// row of the stacked matrix with the same LANES (qmv_core), whatever TOK: decode and verify agree
// bitwise. gelu_tanh: gelu.wgsl.

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

const PAIRS: u32 = {{PAIRS}}u;

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = ((wid.x + wid.z * nwg.x) * TEAMS + lid / LANES) * PAIRS;
    let t0 = wid.y * TOK;
    // Out-of-range rows and tokens are clamped (computed, never stored).
    var rows: array<u32, RPT>;
    // @unroll r PAIRS
    rows[{r}] = min(r0 + {r}u, p.rows - 1u);
    rows[PAIRS + {r}u] = p.rows + min(r0 + {r}u, p.rows - 1u);
    // @end r
    var xrows: array<u32, TOK>;
    // @unroll t TOK
    xrows[{t}] = (min(t0 + {t}u, count - 1u) * p.x_stride) / 4u;
    // @end t
    qmv_reduce(qmv_dots(rows, xrows, lane, p.cols, p.gs), lid, lane);
    if (lane == 0u) {
        // @unroll r PAIRS
        // @unroll t TOK
        if (r0 + {r}u < p.rows && t0 + {t}u < count) {
            let gate = red[({r}u * TOK + {t}u) * WG + lid];
            let up = red[((PAIRS + {r}u) * TOK + {t}u) * WG + lid];
            y[(t0 + {t}u) * p.y_stride + p.y_off + r0 + {r}u] = gelu_tanh(gate) * up;
        }
        // @end t
        // @end r
    }
}
