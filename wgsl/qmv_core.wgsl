// qmv_core: the 4-bit mat-vec loop shared by qmv.wgsl (dense decode/verify) and qmv_moe.wgsl
// (routed experts, per (token, slot) pair). Prepended by the host after the kernel's bindings
// (`w`: array<vec4<u32>>, `scales`, `biases`: array<u32>, and `xload(i)`: the i-th vec4 of x,
// from the `x` binding or, in the fused-norm form, from workgroup memory: declared by the kernel), with formats/groups.wgsl (scale_at, bias_at, nibbles), LANES, RPT, TOK substituted and
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

// The staged form (STAGE, qmv_dots_staged): NCH chunks per round, all of the workgroup's teams
// on the same chunks, x of a round staged once per workgroup: x · pre in xst as
// [t][vec4 j of the chunk][chunk of the round] (consecutive lanes read consecutive vec4s: no
// bank conflicts), the chunk's Σ x in xsum[t][chunk]. 1-element arrays when not staged.
const STAGE: bool = {{STAGE}};
const NCH: u32 = LANES * CU;
var<workgroup> xst: array<vec4<f32>, select(1u, TOK * 8u * NCH, STAGE)>;
var<workgroup> xsum: array<f32, select(1u, TOK * NCH, STAGE)>;

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
        let v{t}_{u}_0 = xload(xb{t}_{u});
        let v{t}_{u}_1 = xload(xb{t}_{u} + 1u);
        let v{t}_{u}_2 = xload(xb{t}_{u} + 2u);
        let v{t}_{u}_3 = xload(xb{t}_{u} + 3u);
        let v{t}_{u}_4 = xload(xb{t}_{u} + 4u);
        let v{t}_{u}_5 = xload(xb{t}_{u} + 5u);
        let v{t}_{u}_6 = xload(xb{t}_{u} + 6u);
        let v{t}_{u}_7 = xload(xb{t}_{u} + 7u);
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

// qmv_dots with x staged in workgroup memory (STAGE; every thread of the workgroup calls it:
// barriers). Why: unstaged, every team reads x from L2 itself, and on the H200 those reads, not
// the weights, bounded the wide mat-vecs (time ∝ x bytes per weight byte: 2 at 4 rows per team;
// PERF_NOTES.md, session 6). Staged, a workgroup reads x once per TEAMS teams, the x · pre
// products and chunk sums are computed once, and no thread holds x in registers across a round.
// Rounds are software-pipelined: the next round's weights and x are loaded into registers
// before this round is computed, so a round's loads are in flight across the barriers.
// The same sums as qmv_dots in the same order: each lane visits chunks lane, lane + LANES, … in
// rounds of CU and adds s · dot32(w, x · pre) + b · Σx per chunk and row as there, the staged
// values being the products and sums qmv_dots forms in registers. A row's arithmetic still
// depends only on LANES, never on TOK (decode and verify rows bitwise equal, tested).
fn qmv_dots_staged(rows: array<u32, RPT>, xrows: array<u32, TOK>, lane: u32, lid: u32, cols: u32, gs: u32) -> array<f32, RPT * TOK> {
    let chunks = cols / 32u;
    let groups = cols / gs;
    let per_group = gs / 32u;
    let pre = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);
    // @unroll r RPT
    // @unroll t TOK
    var acc{r}_{t} = 0.0;
    // @end t
    // @end r
    // This thread's staging task: chunk sk of each round for token st (threads past TOK · NCH
    // stage nothing).
    let stager = lid < TOK * NCH;
    let st = min(lid / NCH, TOK - 1u);
    let sk = lid % NCH;
    var sxrow = 0u;
    // @unroll t TOK
    if (st == {t}u) { sxrow = xrows[{t}]; }
    // @end t
    // Round 0's loads (chunk indices clamped: a round past the end loads a valid chunk, unused).
    // @unroll u CU
    let c{u} = min(lane + {u}u * LANES, chunks - 1u);
    // @unroll r RPT
    var w{r}_{u} = w[rows[{r}] * chunks + c{u}];
    var s{r}_{u} = scale_at(rows[{r}] * groups + c{u} / per_group);
    var b{r}_{u} = bias_at(rows[{r}] * groups + c{u} / per_group);
    // @end r
    // @end u
    // @unroll i 8
    var v{i} = vec4<f32>(0.0);
    // @end i
    if (stager) {
        let xb = sxrow + min(sk, chunks - 1u) * 8u;
        // @unroll i 8
        v{i} = xload(xb + {i}u);
        // @end i
    }
    for (var base = 0u; base < chunks; base += NCH) {
        if (stager) {
            xsum[st * NCH + sk] = ((dot(v0, vec4<f32>(1.0)) + dot(v1, vec4<f32>(1.0))) + (dot(v2, vec4<f32>(1.0)) + dot(v3, vec4<f32>(1.0))))
                                + ((dot(v4, vec4<f32>(1.0)) + dot(v5, vec4<f32>(1.0))) + (dot(v6, vec4<f32>(1.0)) + dot(v7, vec4<f32>(1.0))));
            let xo = st * 8u * NCH + sk;
            // @unroll i 8
            xst[xo + {i}u * NCH] = v{i} * pre;
            // @end i
        }
        workgroupBarrier();
        // The next round's loads, issued before this round's arithmetic.
        let next = base + NCH;
        // @unroll u CU
        let nc{u} = min(next + lane + {u}u * LANES, chunks - 1u);
        // @unroll r RPT
        let nw{r}_{u} = w[rows[{r}] * chunks + nc{u}];
        let ns{r}_{u} = scale_at(rows[{r}] * groups + nc{u} / per_group);
        let nb{r}_{u} = bias_at(rows[{r}] * groups + nc{u} / per_group);
        // @end r
        // @end u
        if (stager && next < chunks) {
            let xb = sxrow + min(next + sk, chunks - 1u) * 8u;
            // @unroll i 8
            v{i} = xload(xb + {i}u);
            // @end i
        }
        // @unroll u CU
        if (base + lane + {u}u * LANES < chunks) {
            let k{u} = lane + {u}u * LANES;
            // @unroll t TOK
            {
                let xo = {t}u * 8u * NCH + k{u};
                let xs = xsum[{t}u * NCH + k{u}];
                // @unroll i 8
                let p{i} = xst[xo + {i}u * NCH];
                // @end i
                // @unroll r RPT
                acc{r}_{t} += s{r}_{u} * dot32(w{r}_{u}, p0, p1, p2, p3, p4, p5, p6, p7) + b{r}_{u} * xs;
                // @end r
            }
            // @end t
        }
        // @end u
        // @unroll u CU
        // @unroll r RPT
        w{r}_{u} = nw{r}_{u};
        s{r}_{u} = ns{r}_{u};
        b{r}_{u} = nb{r}_{u};
        // @end r
        // @end u
        // The next round restages x: every thread is done reading this one.
        workgroupBarrier();
    }
    var out: array<f32, RPT * TOK>;
    // @unroll r RPT
    // @unroll t TOK
    out[{r}u * TOK + {t}u] = acc{r}_{t};
    // @end t
    // @end r
    return out;
}

// The kernel's dot loop: staged where the host allows it (STAGE) and a row has more than two
// chunks per lane (at fewer, a decode round holds all of x: each team reads each x chunk once
// either way, and in a decode step the staged form's barriers cost ≈ 1 µs there: PERF_NOTES.md,
// session 6), else qmv_dots. The choice depends on cols and LANES only, so decode and verify
// tiles of a matrix take the same loop. Every thread of the workgroup calls it (a uniform
// branch: barriers inside).
fn qmv_dots_wg(rows: array<u32, RPT>, xrows: array<u32, TOK>, lane: u32, lid: u32, cols: u32, gs: u32) -> array<f32, RPT * TOK> {
    if (STAGE && cols / 32u > 2u * LANES) {
        return qmv_dots_staged(rows, xrows, lane, lid, cols, gs);
    }
    return qmv_dots(rows, xrows, lane, cols, gs);
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
