// qmv_xdigits: the x-digits form of qmv.wgsl's plain mat-vec (`Kernel::Qmv` with `xd` > 0). Its
// prologue converts the token's x row (cols = 4 · N4 values, from the `x` binding at
// min(t0, count - 1) · x_stride) into qmv_digits.wgsl's workgroup layout, one thread per
// 32-value chunk, and the loop is `qmv_dots_digits` on those digits (token tile 1: xrows[0] = 0).
// Appended by the host to qmv.wgsl with qmv_digits.wgsl (N4 = cols / 4, DIGITS on).
//
// Why (PERF_NOTES.md, session 36): the rule gives rows of at most two chunks a lane (E2B's and
// E4B's attention output projection, 2048 columns at 32 lanes × 1 row; the per-layer projection,
// 256 columns at 8 lanes) the float loop, where every team reads x itself: four teams a
// workgroup read 32 KB of x from L2 for 4.6 KB of weights at E2B's o projection. Here a workgroup
// reads x once, and the loop's arithmetic is the digit loop's (about a third of the float
// loop's, session 34). The host enables it only where one token's digits and `red` fit 16 KiB
// (`with_x_digits`), and gives verify steps the same one-token tile, so their rows are bitwise a
// decode step's.

fn xload(i: u32) -> vec4<f32> { return x[i]; }

// Every thread calls it before the loop (one barrier).
fn qmv_stage_x(lid: u32, t0: u32, count: u32) {
    let x0 = (min(t0, count - 1u) * p.x_stride) / 4u;
    for (var c = lid; c < NCHUNK; c += WG) {
        let xb = x0 + 8u * c;
        // @unroll i 8
        let v{i} = x[xb + {i}u];
        // @end i
        store_digits(c, v0, v1, v2, v3, v4, v5, v6, v7);
    }
    workgroupBarrier();
}
