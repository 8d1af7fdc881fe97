// Weight format bf16: row-major bf16[rows * cols], two per u32 word (element 2i in the low half).
// Widening bf16 to f32 is exact. `scales` and `biases` are bound but unused.
// load8 needs cols % 8 == 0 (callers use it only for the first cols / 8 chunks of a row, and
// only when cols is a multiple of 8); load1 serves the rest.

fn load8(row: u32, c8: u32, cols: u32, gs: u32) -> array<f32, 8> {
    let base = (row * cols + c8 * 8u) / 2u;
    var out: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        let word = w[base + j];
        out[2u * j] = bitcast<f32>(word << 16u);
        out[2u * j + 1u] = bitcast<f32>(word & 0xffff0000u);
    }
    return out;
}

// Value of row `row`, column `c`: for rows whose length is not a multiple of 8 (the tail).
fn load1(row: u32, c: u32, cols: u32, gs: u32) -> f32 {
    let i = row * cols + c;
    let word = w[i / 2u];
    return select(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u), (i & 1u) == 1u);
}
