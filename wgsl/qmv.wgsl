// qmv: 4-bit mat-vec for decode and verify steps: y[t, y_off + r] = Σ_k W[r, k] · x[t, k]
// for rows r < rows, tokens t < count (TOK = 1 for decode, a small tile for verify).
// The GeGLU form (qmv_glu: GLU = PAIRS > 0) reads a stacked [gate; up] matrix of 2·rows rows:
//   y[t, y_off + r] = gelu_tanh(Σ_k W[r, k] · x[t, k]) · Σ_k W[rows + r, k] · x[t, k]
// one dispatch instead of three (gate, up, gelu_mul) per MLP; each gate or up row's sum is the
// one the plain form computes for that row with the same LANES (gelu_tanh: gelu.wgsl).
// The gated form (qmv_gelu_b: GB = RPT) multiplies by a row of another buffer:
//   y[t, y_off + r] = gelu_tanh(Σ_k W[r, k] · x[t, k]) · gb[t · b_stride + b_off + r]
// (Gemma 4's per-layer input gate: one dispatch instead of two per layer); its params are
// MatmulParams with b_stride, b_off (matmul_gb_params.wgsl) and `gb` is binding 7.
//
// Bindings (the same as matmul.wgsl, so it is that kernel's decode variant):
//   w: MLX affine 4-bit, u32[rows * cols / 8] read as vec4<u32>: 32 values per load;
//   scales, biases: bf16[rows * cols / gs], two per u32 (element 2i in the low half);
//   x: f32[count, x_stride] read as vec4<f32>; y: f32[count, y_stride]; p: MatmulParams; step: Step.
// Launch: 128 threads = TEAMS teams of LANES lanes; a team owns OWN consecutive output rows
//   (plain: OWN = RPT rows of W; GeGLU: OWN = PAIRS gate rows and the PAIRS up rows below them,
//   RPT = 2 · PAIRS), a workgroup TEAMS * OWN rows × TOK tokens; grid = (ceil(rows / (TEAMS *
//   OWN)), ceil(count / TOK)), x folded into x·z past 65535 as in matmul.wgsl.
// Host guarantees: cols % 64 == 0 (whole groups; gs a multiple of 64, so a 32-value chunk lies in
//   one group), x_stride % 4 == 0.
// The fused-norm form (PRO, qmv_norm.wgsl appended): x is the residual branch's output `a`,
//   and the matrix multiplies the normed residual the workgroup computes first (see there).
// The loop and the reduction are qmv_core.wgsl (appended by the host; why the shape: there).

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;
// {{GB_BINDING}}
// {{XLOAD}}

const OWN: u32 = {{OWN}}u;

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let t0 = wid.y * TOK;
    var xrows: array<u32, TOK>;
    // @unroll t TOK
    xrows[{t}] = {{XROW}};
    // @end t
    // {{PROLOGUE}}
    let r0 = ((wid.x + wid.z * nwg.x) * TEAMS + lid / LANES) * OWN;
    // Out-of-range rows and tokens are clamped (computed, never stored).
    var rows: array<u32, RPT>;
    // @unroll r OWN
    rows[{r}] = min(r0 + {r}u, p.rows - 1u);
    // @end r
    // @unroll r GLU
    rows[OWN + {r}u] = p.rows + min(r0 + {r}u, p.rows - 1u);
    // @end r
    qmv_reduce({{DOTS}}(rows, xrows, lane, lid, p.cols, p.gs), lid, lane);
    if (lane == 0u) {
        // @unroll r PLAIN
        // @unroll t TOK
        if (r0 + {r}u < p.rows && t0 + {t}u < count) {
            y[(t0 + {t}u) * p.y_stride + p.y_off + r0 + {r}u] = red[({r}u * TOK + {t}u) * WG + lid];
        }
        // @end t
        // @end r
        // @unroll r GB
        // @unroll t TOK
        if (r0 + {r}u < p.rows && t0 + {t}u < count) {
            let gate = red[({r}u * TOK + {t}u) * WG + lid];
            y[(t0 + {t}u) * p.y_stride + p.y_off + r0 + {r}u] = gelu_tanh(gate) * gb[(t0 + {t}u) * p.b_stride + p.b_off + r0 + {r}u];
        }
        // @end t
        // @end r
        // @unroll r GLU
        // @unroll t TOK
        if (r0 + {r}u < p.rows && t0 + {t}u < count) {
            let gate = red[({r}u * TOK + {t}u) * WG + lid];
            let up = red[((OWN + {r}u) * TOK + {t}u) * WG + lid];
            y[(t0 + {t}u) * p.y_stride + p.y_off + r0 + {r}u] = gelu_tanh(gate) * up;
        }
        // @end t
        // @end r
    }
}
