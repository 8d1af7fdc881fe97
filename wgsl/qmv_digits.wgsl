// qmv_digits: a mat-vec's input held whole in workgroup memory, and the loop that multiplies the
// 4-bit weights by its integer digits. Appended by the host (after qmv_core.wgsl's declarations
// are in the same module) to the fused-norm mat-vecs (qmv.wgsl with qmv_norm.wgsl, whose
// prologue forms x here) and to the routed-expert mat-vecs (qmv_moe.wgsl, which stage their x
// here with `stage_x_digits`); with N4 (vec4s of one x row: cols / 4) and DIGITS substituted.
//
// Layout: xw[t · N4 + j · NCHUNK + c] is slot j of 32-value chunk c of token t. As floats
// (qmv_norm.wgsl before its conversion) slot j holds the chunk's values 4j..4j+3; as digits
// (store_digits) slots 0–5 hold dot32i's six digit vectors and slot 6 the chunk's scale 2^-k and
// Σx as bits (slot 7 unused). Consecutive lanes read consecutive chunks' slots: consecutive
// addresses, no bank conflicts.
//
// Why (ledger: 2026-12-05 qmv-digits-fused-norm): qmv_core's float loop spends about five
// instructions per weight on unpacking nibbles and multiply-adds, dot32i about one and a half. A
// workgroup that already holds its whole x (the fused-norm forms) or needs only a short one (an
// expert's) can turn each chunk into digits once and let every team of the workgroup share them.
// The mat-vecs this serves are single-wave kernels whose arithmetic follows their loads rather than
// hiding behind them, so the instructions saved are time saved.

const N4: u32 = {{N4}}u;
const NCHUNK: u32 = N4 / 8u; // 32-value chunks per row
// Whether the loop is qmv_dots_digits (else the kernel's float loop reads xw or x as floats).
const DIGITS: bool = {{DIGITS}};

var<workgroup> xw: array<vec4<u32>, TOK * N4>;

// Writes the digits of one chunk (v0..v7: its 32 values) to the slots from xw[b] (b = t · N4 + c).
fn store_digits(b: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>) {
    let d = chunk_digits(v0, v1, v2, v3, v4, v5, v6, v7);
    let xs = chunk_sum(v0, v1, v2, v3, v4, v5, v6, v7);
    xw[b] = d.p0;
    xw[b + NCHUNK] = d.p1;
    xw[b + 2u * NCHUNK] = d.p2;
    xw[b + 3u * NCHUNK] = d.p3;
    xw[b + 4u * NCHUNK] = d.p4;
    xw[b + 5u * NCHUNK] = d.p5;
    xw[b + 6u * NCHUNK] = vec4<u32>(bitcast<u32>(d.scale), bitcast<u32>(xs), 0u, 0u);
}

// Stages one x row (N4 vec4s of the kernel's `x` binding from vec4 `x0`) as digits at xw[0..],
// each 32-value chunk converted by one thread, then a barrier. Every thread calls it.
fn stage_x_digits(lid: u32, x0: u32) {
    for (var c = lid; c < NCHUNK; c += WG) {
        let xb = x0 + 8u * c;
        // @unroll i 8
        let v{i} = x[xb + {i}u];
        // @end i
        store_digits(c, v0, v1, v2, v3, v4, v5, v6, v7);
    }
    workgroupBarrier();
}

// qmv_dots with the staged loop's arithmetic per chunk, s · (dot32i(w, x digits) · 2^-k) + b · Σx,
// on the digits in xw (token t's from xw[xrows[t]]): the same chunks per lane in the same
// order, CU at a time, so a row's arithmetic depends only on LANES and cols (decode and verify
// rows bitwise equal). Every thread may call it (no barriers).
fn qmv_dots_digits(rows: array<u32, RPT>, xrows: array<u32, TOK>, lane: u32, lid: u32, cols: u32, gs: u32) -> array<f32, RPT * TOK> {
    let chunks = cols / 32u;
    let groups = cols / gs;
    let per_group = gs / 32u;
    // @unroll r RPT
    // @unroll t TOK
    var acc{r}_{t} = 0.0;
    // @end t
    // @end r
    for (var c0 = lane; c0 < chunks; c0 += LANES * CU) {
        // @unroll u CU
        let c{u} = min(c0 + {u}u * LANES, chunks - 1u);
        // @unroll r RPT
        let k{r}_{u} = chunk_w(rows[{r}], c{u}, chunks, groups, per_group);
        // @end r
        // @end u
        // @unroll u CU
        if (c0 + {u}u * LANES < chunks) {
            // @unroll t TOK
            {
                let xb = xrows[{t}] + c{u};
                let ks = bitcast<vec4<f32>>(xw[xb + 6u * NCHUNK]);
                // @unroll i 6
                let p{i} = xw[xb + {i}u * NCHUNK];
                // @end i
                // @unroll r RPT
                acc{r}_{t} += k{r}_{u}.s * (dot32i(k{r}_{u}.w, p0, p1, p2, p3, p4, p5) * ks.x) + k{r}_{u}.b * ks.y;
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
