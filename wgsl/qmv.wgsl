// qmv: 4-bit mat-vec for decode and verify steps: y[t, y_off + r] = Σ_k W[r, k] · x[t, k]
// for rows r < rows, tokens t < count (TOK = 1 for decode, a small tile for verify).
//
// Bindings (the same as matmul.wgsl, so it is that kernel's decode variant):
//   w: MLX affine 4-bit, u32[rows * cols / 8] read as vec4<u32>: 32 values per load;
//   scales, biases: bf16[rows * cols / gs], two per u32 (element 2i in the low half);
//   x: f32[count, x_stride] read as vec4<f32>; y: f32[count, y_stride]; p: MatmulParams; step: Step.
// Launch: 128 threads = TEAMS teams of LANES lanes; a team owns RPT consecutive rows, a workgroup
//   TEAMS * RPT rows × TOK tokens; grid = (ceil(rows / (TEAMS * RPT)), ceil(count / TOK)), x
//   folded into x·z past 65535 as in matmul.wgsl.
// Host guarantees: cols % 64 == 0 (whole groups; gs a multiple of 64, so a 32-value chunk lies in
//   one group), x_stride % 4 == 0.
//
// Why this shape (PERF_NOTES.md): a decode mat-vec is bound by how many bytes are in flight, so
// each lane issues RPT independent 16-byte weight loads per step and the MLX affine identity
//   Σ (s·q + b)·x = s·Σ q·x + b·Σ x
// leaves one multiply-add per value. Nibbles become floats without an int→float conversion
// (a quarter-rate instruction on NVIDIA): a nibble masked in place at bit 4j is OR-ed into the
// mantissa of 2^23, giving exactly 2^23 + q·16^j; subtracting 2^23 leaves q·16^j, and x is
// pre-scaled by 16^-j once per chunk (a power of two: q·x is rounded exactly as before).
// The host expands the `@unroll NAME COUNT` … `@end NAME` blocks (kernels.rs `unroll`), so no
// array is indexed at run time: every accumulator, weight and x value stays in a register.
// A row's arithmetic depends only on LANES (chunk order and the reduction tree), never on TOK,
// RPT or the step, so decode (TOK = 1) and verify (TOK > 1) give bitwise-identical rows.
const WG: u32 = 128u;
const LANES: u32 = {{LANES}}u;
const RPT: u32 = {{RPT}}u;
const TOK: u32 = {{TOK}}u;
const TEAMS: u32 = WG / LANES;

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: MatmulParams;
@group(0) @binding(6) var<uniform> step: Step;

var<workgroup> red: array<f32, RPT * TOK * WG>; // [RPT * TOK][WG]

fn bf16_pair(word: u32, odd: bool) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, odd));
}

// q·16^j for the four nibbles of the low 16 bits of h (nibble j at bits 4j..4j+3).
fn nibbles(h: u32) -> vec4<f32> {
    let m = vec4<u32>(h) & vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
    return bitcast<vec4<f32>>(m | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

// Σ q·x over the 32 values of one vec4 of weights against the pre-scaled x of its chunk.
fn dot32(wv: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
         x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    return ((dot(nibbles(wv.x), x0) + dot(nibbles(wv.x >> 16u), x1))
          + (dot(nibbles(wv.y), x2) + dot(nibbles(wv.y >> 16u), x3)))
         + ((dot(nibbles(wv.z), x4) + dot(nibbles(wv.z >> 16u), x5))
          + (dot(nibbles(wv.w), x6) + dot(nibbles(wv.w >> 16u), x7)));
}

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r0 = ((wid.x + wid.z * nwg.x) * TEAMS + lid / LANES) * RPT;
    let t0 = wid.y * TOK;
    let chunks = p.cols / 32u;
    let groups = p.cols / p.gs;
    let per_group = p.gs / 32u;
    let pre = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);
    // Out-of-range rows and tokens are clamped (computed, never stored).
    // @unroll r RPT
    let row{r} = min(r0 + {r}u, p.rows - 1u);
    // @unroll t TOK
    var acc{r}_{t} = 0.0;
    // @end t
    // @end r
    // @unroll t TOK
    let xrow{t} = (min(t0 + {t}u, count - 1u) * p.x_stride) / 4u;
    // @end t
    for (var c = lane; c < chunks; c += LANES) {
        // @unroll r RPT
        let w{r} = w[row{r} * chunks + c];
        let g{r} = row{r} * groups + c / per_group;
        let s{r} = bf16_pair(scales[g{r} >> 1u], (g{r} & 1u) == 1u);
        let b{r} = bf16_pair(biases[g{r} >> 1u], (g{r} & 1u) == 1u);
        // @end r
        // @unroll t TOK
        {
            let xb = xrow{t} + c * 8u;
            let v0 = x[xb];
            let v1 = x[xb + 1u];
            let v2 = x[xb + 2u];
            let v3 = x[xb + 3u];
            let v4 = x[xb + 4u];
            let v5 = x[xb + 5u];
            let v6 = x[xb + 6u];
            let v7 = x[xb + 7u];
            let xs = ((dot(v0, vec4<f32>(1.0)) + dot(v1, vec4<f32>(1.0))) + (dot(v2, vec4<f32>(1.0)) + dot(v3, vec4<f32>(1.0))))
                   + ((dot(v4, vec4<f32>(1.0)) + dot(v5, vec4<f32>(1.0))) + (dot(v6, vec4<f32>(1.0)) + dot(v7, vec4<f32>(1.0))));
            // @unroll r RPT
            acc{r}_{t} += s{r} * dot32(w{r}, v0 * pre, v1 * pre, v2 * pre, v3 * pre, v4 * pre, v5 * pre, v6 * pre, v7 * pre) + b{r} * xs;
            // @end r
        }
        // @end t
    }
    // @unroll r RPT
    // @unroll t TOK
    red[({r}u * TOK + {t}u) * WG + lid] = acc{r}_{t};
    // @end t
    // @end r
    workgroupBarrier();
    for (var h = LANES / 2u; h > 0u; h >>= 1u) {
        if (lane < h) {
            for (var i = 0u; i < RPT * TOK; i++) { red[i * WG + lid] += red[i * WG + lid + h]; }
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        // @unroll r RPT
        // @unroll t TOK
        if (r0 + {r}u < p.rows && t0 + {t}u < count) {
            y[(t0 + {t}u) * p.y_stride + p.y_off + r0 + {r}u] = red[({r}u * TOK + {t}u) * WG + lid];
        }
        // @end t
        // @end r
    }
}
