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
// Why this shape (ledger: 2026-11-30 qmv-v1): a decode mat-vec is bound by how many bytes are
// in flight, so each lane issues RPT independent 16-byte weight loads per step and the MLX
// affine identity
//   Σ (s·q + b)·x = s·Σ q·x + b·Σ x
// leaves one multiply-add per value. Nibbles become floats without an int→float conversion
// (a quarter-rate instruction on NVIDIA): a nibble masked in place at bit 4j is OR-ed into the
// mantissa of 2^23, giving exactly 2^23 + q·16^j; subtracting 2^23 leaves q·16^j, and x is
// pre-scaled by 16^-j once per chunk (a power of two: q·x is rounded exactly as before). The
// staged loop, where x is shared by a workgroup's teams, multiplies nibbles by integer digits of
// x instead (dot32i: four products per instruction).
// The `@unroll` blocks keep every accumulator, weight and x value in a register (a loop the
// driver leaves rolled puts indexed arrays in local memory: 2.6× slower, ledger: 2026-11-30
// qmv-unrolled).
// A row's arithmetic depends only on LANES and cols (chunk order, the reduction tree, and
// whether the loop is staged), never on TOK, RPT or the step, so decode (TOK = 1) and verify
// (TOK > 1) give bitwise-identical rows.
const WG: u32 = 128u;
const LANES: u32 = {{LANES}}u;
const RPT: u32 = {{RPT}}u;
const TOK: u32 = {{TOK}}u;
const TEAMS: u32 = WG / LANES;
const CU: u32 = {{CU}}u; // chunks per lane whose loads are issued together (2 for decode, 1 for verify tiles)

var<workgroup> red: array<f32, RPT * TOK * WG>; // [RPT * TOK][WG]

// The staged form (STAGE, qmv_dots_staged): NCH chunks per round, all of the workgroup's teams
// on the same chunks, x of a round staged once per workgroup as integers (stage_chunk): the
// chunk's packed signed digits in xq as [t][vec4 j of 6][chunk of the round] (consecutive lanes
// read consecutive vec4s: no bank conflicts), its scale 2^-k in xsc[t][chunk] and its Σ x in
// xsum[t][chunk]. 1-element arrays when not staged.
const STAGE: bool = {{STAGE}};
const NCH: u32 = LANES * CU;
var<workgroup> xq: array<vec4<u32>, select(1u, TOK * 6u * NCH, STAGE)>;
var<workgroup> xsc: array<f32, select(1u, TOK * NCH, STAGE)>;
var<workgroup> xsum: array<f32, select(1u, TOK * NCH, STAGE)>;

// Σ q·x over the 32 values of one vec4 of weights against the pre-scaled x of its chunk.
fn dot32(wv: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
         x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    return ((dot(nibbles(wv.x), x0) + dot(nibbles(wv.x >> 16u), x1))
          + (dot(nibbles(wv.y), x2) + dot(nibbles(wv.y >> 16u), x3)))
         + ((dot(nibbles(wv.z), x4) + dot(nibbles(wv.z >> 16u), x5))
          + (dot(nibbles(wv.w), x6) + dot(nibbles(wv.w >> 16u), x7)));
}

// The staged loop's arithmetic: Σ q·x over 32 values with x as integers. Why (ledger:
// 2026-12-01 qmv-ceilings, 2026-12-01 qmv-integer-dot): on the big mat-vecs a third of the time
// was dot32's per-value work (mask, or, subtract, multiply-add per nibble; dropping the float
// subtract alone moved nothing, so its integer part bound it); a packed 4×8-bit integer dot
// product multiplies four nibbles by four bytes of x in one instruction (256 MiB matrix
// 154 → 100 µs with the long-row tile: ledger: 2026-12-01 qmv-sweep-integer).
// x is staged per 32-value chunk as X = round(x · 2^k), k chosen so that the chunk's largest
// |x| · 2^k lies in [2^21, 2^22) (so |X| ≤ 2^22, and X keeps 22 bits: an element's error, at most
// half a unit of X, is 0.5 · 2^-k ≤ 2^-22 of the chunk's largest |x|, where f32 rounding is 2^-24
// of the element; chunks whose largest |x| is below 2^-105 get k = 126 and a smaller X), split
// into three signed base-256 digits X = a·2^16 + b·2^8 + c (a in [−64, 64], b, c in
// [−128, 127]). The sums of q times each digit are exact integers (≤ 32 · 15 · 128); they are
// combined in one rounding,
// Σ q·X = fma(Σ q·a, 2^16, Σ q·b · 256 + Σ q·c) (the second term exact below 2^24), and
// scaled by 2^-k (exact). The packing (stage_chunk) puts a word's even-numbered values in one
// u32 and the odd ones in the next, matching the nibbles `w & 0x0f0f0f0f` and
// `(w >> 4) & 0x0f0f0f0f` take from one word of weights.
fn dot32i(wv: vec4<u32>, a0: vec4<u32>, a1: vec4<u32>, b0: vec4<u32>, b1: vec4<u32>, c0: vec4<u32>, c1: vec4<u32>) -> f32 {
    let l0 = wv.x & 0x0f0f0f0fu;
    let h0 = (wv.x >> 4u) & 0x0f0f0f0fu;
    let l1 = wv.y & 0x0f0f0f0fu;
    let h1 = (wv.y >> 4u) & 0x0f0f0f0fu;
    let l2 = wv.z & 0x0f0f0f0fu;
    let h2 = (wv.z >> 4u) & 0x0f0f0f0fu;
    let l3 = wv.w & 0x0f0f0f0fu;
    let h3 = (wv.w >> 4u) & 0x0f0f0f0fu;
    let sa = ((dot4I8Packed(l0, a0.x) + dot4I8Packed(h0, a0.y)) + (dot4I8Packed(l1, a0.z) + dot4I8Packed(h1, a0.w)))
           + ((dot4I8Packed(l2, a1.x) + dot4I8Packed(h2, a1.y)) + (dot4I8Packed(l3, a1.z) + dot4I8Packed(h3, a1.w)));
    let sb = ((dot4I8Packed(l0, b0.x) + dot4I8Packed(h0, b0.y)) + (dot4I8Packed(l1, b0.z) + dot4I8Packed(h1, b0.w)))
           + ((dot4I8Packed(l2, b1.x) + dot4I8Packed(h2, b1.y)) + (dot4I8Packed(l3, b1.z) + dot4I8Packed(h3, b1.w)));
    let sc = ((dot4I8Packed(l0, c0.x) + dot4I8Packed(h0, c0.y)) + (dot4I8Packed(l1, c0.z) + dot4I8Packed(h1, c0.w)))
           + ((dot4I8Packed(l2, c1.x) + dot4I8Packed(h2, c1.y)) + (dot4I8Packed(l3, c1.z) + dot4I8Packed(h3, c1.w)));
    return fma(f32(sa), 65536.0, f32(sb * 256i + sc));
}

// The three digits of X for four values, biased by 128 each (U = X + 0x808080, 24 bits), packed
// one value per byte and unbiased by flipping each byte's top bit: (a, b, c) as three words of
// signed bytes.
fn digits4(u: vec4<u32>) -> vec3<u32> {
    return vec3<u32>(pack4xU8(u >> vec4<u32>(16u)), pack4xU8(u >> vec4<u32>(8u)), pack4xU8(u)) ^ vec3<u32>(0x80808080u);
}

// One chunk of x (v0..v7: its 32 values) as dot32i's integer digits: p0..p5 are its arguments
// a0, a1, b0, b1, c0, c1, and `scale` the 2^-k that undoes X = round(x · 2^k).
struct ChunkDigits {
    p0: vec4<u32>,
    p1: vec4<u32>,
    p2: vec4<u32>,
    p3: vec4<u32>,
    p4: vec4<u32>,
    p5: vec4<u32>,
    scale: f32,
}

fn chunk_digits(v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) -> ChunkDigits {
    let mv = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    // e: the biased exponent of the largest |x| (clamped: all-tiny chunks round to small X; a
    // non-finite x makes xsum, so the row, non-finite). 2^k = 2^(148 − e) keeps |X| ≤ 2^22.
    let e = clamp(bitcast<u32>(max(max(mv.x, mv.y), max(mv.z, mv.w))) >> 23u, 22u, 254u);
    let up = bitcast<f32>((275u - e) << 23u);
    // fma(x, 2^k, 1.5 · 2^23) rounds x · 2^k to the integer X in the low mantissa bits
    // (0x4b400000 + X), which the add turns into U = X + 0x808080.
    let magic = vec4<f32>(12582912.0);
    let bias = vec4<u32>(0xb5408080u); // 0x808080 − 0x4b400000 (mod 2^32)
    let ua0 = bitcast<vec4<u32>>(fma(v0, vec4<f32>(up), magic)) + bias;
    let ua1 = bitcast<vec4<u32>>(fma(v1, vec4<f32>(up), magic)) + bias;
    let ua2 = bitcast<vec4<u32>>(fma(v2, vec4<f32>(up), magic)) + bias;
    let ua3 = bitcast<vec4<u32>>(fma(v3, vec4<f32>(up), magic)) + bias;
    let ub0 = bitcast<vec4<u32>>(fma(v4, vec4<f32>(up), magic)) + bias;
    let ub1 = bitcast<vec4<u32>>(fma(v5, vec4<f32>(up), magic)) + bias;
    let ub2 = bitcast<vec4<u32>>(fma(v6, vec4<f32>(up), magic)) + bias;
    let ub3 = bitcast<vec4<u32>>(fma(v7, vec4<f32>(up), magic)) + bias;
    // Word w of the chunk: values 8w..8w+7, the even ones then the odd ones.
    let d0 = digits4(vec4<u32>(ua0.x, ua0.z, ua1.x, ua1.z));
    let e0 = digits4(vec4<u32>(ua0.y, ua0.w, ua1.y, ua1.w));
    let d1 = digits4(vec4<u32>(ua2.x, ua2.z, ua3.x, ua3.z));
    let e1 = digits4(vec4<u32>(ua2.y, ua2.w, ua3.y, ua3.w));
    let d2 = digits4(vec4<u32>(ub0.x, ub0.z, ub1.x, ub1.z));
    let e2 = digits4(vec4<u32>(ub0.y, ub0.w, ub1.y, ub1.w));
    let d3 = digits4(vec4<u32>(ub2.x, ub2.z, ub3.x, ub3.z));
    let e3 = digits4(vec4<u32>(ub2.y, ub2.w, ub3.y, ub3.w));
    return ChunkDigits(
        vec4<u32>(d0.x, e0.x, d1.x, e1.x), vec4<u32>(d2.x, e2.x, d3.x, e3.x),
        vec4<u32>(d0.y, e0.y, d1.y, e1.y), vec4<u32>(d2.y, e2.y, d3.y, e3.y),
        vec4<u32>(d0.z, e0.z, d1.z, e1.z), vec4<u32>(d2.z, e2.z, d3.z, e3.z),
        bitcast<f32>((e - 21u) << 23u));
}

// Σ of a chunk's 32 values, in the one order every loop uses (the bias term's Σx).
fn chunk_sum(v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) -> f32 {
    return ((dot(v0, vec4<f32>(1.0)) + dot(v1, vec4<f32>(1.0))) + (dot(v2, vec4<f32>(1.0)) + dot(v3, vec4<f32>(1.0))))
         + ((dot(v4, vec4<f32>(1.0)) + dot(v5, vec4<f32>(1.0))) + (dot(v6, vec4<f32>(1.0)) + dot(v7, vec4<f32>(1.0))));
}

// Stages one chunk of x (v0..v7: its 32 values) for token st, chunk sk of the round (dot32i).
fn stage_chunk(st: u32, sk: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) {
    let d = chunk_digits(v0, v1, v2, v3, v4, v5, v6, v7);
    xsc[st * NCH + sk] = d.scale;
    let xo = st * 6u * NCH + sk;
    xq[xo] = d.p0;
    xq[xo + NCH] = d.p1;
    xq[xo + 2u * NCH] = d.p2;
    xq[xo + 3u * NCH] = d.p3;
    xq[xo + 4u * NCH] = d.p4;
    xq[xo + 5u * NCH] = d.p5;
}

// One chunk of a row's weights and its group's scale and bias: the loads the unstaged loops
// issue per (row, chunk) before they use any.
struct ChunkW {
    w: vec4<u32>,
    s: f32,
    b: f32,
}

fn chunk_w(row: u32, c: u32, chunks: u32, groups: u32, per_group: u32) -> ChunkW {
    let g = row * groups + c / per_group;
    return ChunkW(w[row * chunks + c], scale_at(g), bias_at(g));
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
        let k{r}_{u} = chunk_w(rows[{r}], c{u}, chunks, groups, per_group);
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
                let xs = chunk_sum(v{t}_{u}_0, v{t}_{u}_1, v{t}_{u}_2, v{t}_{u}_3, v{t}_{u}_4, v{t}_{u}_5, v{t}_{u}_6, v{t}_{u}_7);
                // @unroll r RPT
                acc{r}_{t} += k{r}_{u}.s * dot32(k{r}_{u}.w, v{t}_{u}_0 * pre, v{t}_{u}_1 * pre, v{t}_{u}_2 * pre, v{t}_{u}_3 * pre, v{t}_{u}_4 * pre, v{t}_{u}_5 * pre, v{t}_{u}_6 * pre, v{t}_{u}_7 * pre) + k{r}_{u}.b * xs;
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
// barriers). Why: unstaged, every team reads x from L2 itself, and on the H200 those reads, not the
// weights, bounded the wide mat-vecs (time ∝ x bytes per weight byte: 2 at 4 rows per team; ledger:
// 2026-11-30 qmv-sweep-warm, 2026-11-30 qmv-stage-x). Staged, a workgroup reads x once per TEAMS
// teams, each chunk's integer digits (dot32i) and sum are computed once, and no thread holds x in
// registers across a round. Rounds are software-pipelined: the next round's weights and x are
// loaded into registers before this round is computed, so a round's loads are in flight across the
// barriers. Each lane visits chunks lane, lane + LANES, … in rounds of CU (as qmv_dots) and adds
// s · (dot32i(w, x digits) · 2^-k) + b · Σx per chunk and row. A row's arithmetic depends only on
// LANES, never on TOK or CU (decode and verify rows bitwise equal, tested).
fn qmv_dots_staged(rows: array<u32, RPT>, xrows: array<u32, TOK>, lane: u32, lid: u32, cols: u32, gs: u32) -> array<f32, RPT * TOK> {
    let chunks = cols / 32u;
    let groups = cols / gs;
    let per_group = gs / 32u;
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
            xsum[st * NCH + sk] = chunk_sum(v0, v1, v2, v3, v4, v5, v6, v7);
            stage_chunk(st, sk, v0, v1, v2, v3, v4, v5, v6, v7);
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
                let xo = {t}u * 6u * NCH + k{u};
                let xs = xsum[{t}u * NCH + k{u}];
                let xk = xsc[{t}u * NCH + k{u}];
                // @unroll i 6
                let p{i} = xq[xo + {i}u * NCH];
                // @end i
                // @unroll r RPT
                acc{r}_{t} += s{r}_{u} * (dot32i(w{r}_{u}, p0, p1, p2, p3, p4, p5) * xk) + b{r}_{u} * xs;
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

// The kernel's dot loop: staged where the host allows it (STAGE) and a row has more than two chunks
// per lane (at fewer, a decode round holds all of x: each team reads each x chunk once either way,
// and in a decode step the staged form's barriers cost ≈ 1 µs there: ledger: 2026-11-30
// qmv-stage-rule-refined), else qmv_dots. The choice depends on cols and LANES only, so decode and
// verify tiles of a matrix take the same loop. Every thread of the workgroup calls it (a uniform
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
