// qmv_core: the 4-bit mat-vec loop shared by qmv.wgsl (dense decode/verify) and qmv_moe.wgsl
// (routed experts, per (token, slot) pair). Prepended by the host after the kernel's bindings
// (`w`: array<vec4<u32>>, `scales`, `biases`: array<u32>, `x`: array<vec4<f32>>, declared by
// the kernel), with formats/groups.wgsl (scale_at, bias_at, nibbles), LANES, RPT, TOK substituted and
// the `@unroll` blocks expanded.
//
// A team of LANES lanes owns RPT rows of W (absolute row indices `rows`) and TOK x vectors
// (vec4 offsets `xrows`); lane `lane` walks the 32-value chunks c = lane, lane + LANES, … and
// `qmv_reduce` adds the lanes' partials in a fixed order, leaving each (row, token) sum in
// red[(r * TOK + t) * WG + lid] of the team's lane 0.
//
// Why this shape (PERF_NOTES.md): a decode mat-vec is bound by how many bytes are in flight, so
// each lane issues RPT independent 16-byte weight loads per step and the MLX affine identity
//   Σ (s·q + b)·x = s·Σ q·x + b·Σ x
// leaves one multiply-add per value. Nibbles become floats without an int→float conversion
// (a quarter-rate instruction on NVIDIA): a nibble masked in place at bit 4j is OR-ed into the
// mantissa of 2^23, giving exactly 2^23 + q·16^j; subtracting 2^23 leaves q·16^j, and x is
// pre-scaled by 16^-j once per chunk (a power of two: q·x is rounded exactly as before).
// The `@unroll` blocks keep every accumulator, weight and x value in a register (a loop the
// driver leaves rolled puts indexed arrays in local memory: 2.6× slower, PERF_NOTES.md).
// A row's arithmetic depends only on LANES (chunk order and the reduction tree), never on TOK,
// RPT or the step, so decode (TOK = 1) and verify (TOK > 1) give bitwise-identical rows.
const WG: u32 = 128u;
const LANES: u32 = {{LANES}}u;
const RPT: u32 = {{RPT}}u;
const TOK: u32 = {{TOK}}u;
const TEAMS: u32 = WG / LANES;
const CU: u32 = {{CU}}u; // chunks per lane whose loads are issued together (2 for decode, 1 for verify tiles)

var<workgroup> red: array<f32, RPT * TOK * WG>; // [RPT * TOK][WG]

// Σ q·x over the 32 values of one vec4 of weights against the pre-scaled x of its chunk.
fn dot32(wv: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
         x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    return ((dot(nibbles(wv.x), x0) + dot(nibbles(wv.x >> 16u), x1))
          + (dot(nibbles(wv.y), x2) + dot(nibbles(wv.y >> 16u), x3)))
         + ((dot(nibbles(wv.z), x4) + dot(nibbles(wv.z >> 16u), x5))
          + (dot(nibbles(wv.w), x6) + dot(nibbles(wv.w >> 16u), x7)));
}

// The lane's partial sums for rows × tokens ([r * TOK + t]) over its chunks of a row of `cols`
// values in groups of `gs`.
fn qmv_dots(rows: array<u32, RPT>, xrows: array<u32, TOK>, lane: u32, cols: u32, gs: u32) -> array<f32, RPT * TOK> {
    let chunks = cols / 32u;
    let groups = cols / gs;
    let per_group = gs / 32u;
    let pre = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);
    // @unroll r RPT
    // @unroll t TOK
    var acc{r}_{t} = 0.0;
    // @end t
    // @end r
    for (var c0 = lane; c0 < chunks; c0 += LANES * CU) {
        // Every load of the round's CU chunks is issued before any is used (a rolled loop waits
        // a memory round trip per chunk); the chunks are then added in chunk order, exactly as
        // one at a time (CU changes no bit of a row).
        // @unroll u CU
        let c{u} = min(c0 + {u}u * LANES, chunks - 1u);
        // @unroll r RPT
        let w{r}_{u} = w[rows[{r}] * chunks + c{u}];
        let g{r}_{u} = rows[{r}] * groups + c{u} / per_group;
        let s{r}_{u} = scale_at(g{r}_{u});
        let b{r}_{u} = bias_at(g{r}_{u});
        // @end r
        // @unroll t TOK
        let xb{t}_{u} = xrows[{t}] + c{u} * 8u;
        let v{t}_{u}_0 = x[xb{t}_{u}];
        let v{t}_{u}_1 = x[xb{t}_{u} + 1u];
        let v{t}_{u}_2 = x[xb{t}_{u} + 2u];
        let v{t}_{u}_3 = x[xb{t}_{u} + 3u];
        let v{t}_{u}_4 = x[xb{t}_{u} + 4u];
        let v{t}_{u}_5 = x[xb{t}_{u} + 5u];
        let v{t}_{u}_6 = x[xb{t}_{u} + 6u];
        let v{t}_{u}_7 = x[xb{t}_{u} + 7u];
        // @end t
        // @end u
        // @unroll u CU
        if (c0 + {u}u * LANES < chunks) {
            // @unroll t TOK
            {
                let xs = ((dot(v{t}_{u}_0, vec4<f32>(1.0)) + dot(v{t}_{u}_1, vec4<f32>(1.0))) + (dot(v{t}_{u}_2, vec4<f32>(1.0)) + dot(v{t}_{u}_3, vec4<f32>(1.0))))
                       + ((dot(v{t}_{u}_4, vec4<f32>(1.0)) + dot(v{t}_{u}_5, vec4<f32>(1.0))) + (dot(v{t}_{u}_6, vec4<f32>(1.0)) + dot(v{t}_{u}_7, vec4<f32>(1.0))));
                // @unroll r RPT
                acc{r}_{t} += s{r}_{u} * dot32(w{r}_{u}, v{t}_{u}_0 * pre, v{t}_{u}_1 * pre, v{t}_{u}_2 * pre, v{t}_{u}_3 * pre, v{t}_{u}_4 * pre, v{t}_{u}_5 * pre, v{t}_{u}_6 * pre, v{t}_{u}_7 * pre) + b{r}_{u} * xs;
                // @end r
            }
            // @end t
        }
        // @end u
    }
    var out: array<f32, RPT * TOK>;
    // @unroll r RPT
    // @unroll t TOK
    out[{r}u * TOK + {t}u] = acc{r}_{t};
    // @end t
    // @end r
    return out;
}

// Adds the partials of the LANES lanes of each team in a fixed order: where the device has
// subgroups of SG lanes, a butterfly (subgroupShuffleXor) over the lanes inside one subgroup —
// no barrier, no workgroup memory — then a tree in workgroup memory over the rest (LANES > SG).
// Every thread of the workgroup must call it (barriers).
const SG: u32 = {{SG}}u;
const BFLY: u32 = min(LANES, SG);

fn qmv_reduce(acc: array<f32, RPT * TOK>, lid: u32, lane: u32) {
    // @unroll i RPT_TOK
    var v{i} = acc[{i}u];
    // @end i
// {{BUTTERFLY}}
    // @unroll i RPT_TOK
    red[{i}u * WG + lid] = v{i};
    // @end i
    if (LANES > BFLY) {
        workgroupBarrier();
        for (var h = LANES / 2u; h >= BFLY; h >>= 1u) {
            if (lane < h) {
                for (var i = 0u; i < RPT * TOK; i++) { red[i * WG + lid] += red[i * WG + lid + h]; }
            }
            workgroupBarrier();
        }
    }
}
