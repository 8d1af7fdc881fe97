// Weight format f32: row-major f32[rows * cols] (f16 checkpoints are widened to this on upload,
// exactly). `scales` and `biases` are bound but unused.

fn load8(row: u32, c8: u32, cols: u32, gs: u32) -> array<f32, 8> {
    let base = row * cols + c8 * 8u;
    var out: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        out[j] = bitcast<f32>(w[base + j]);
    }
    return out;
}

// Value of row `row`, column `c`: for rows whose length is not a multiple of 8 (the tail).
fn load1(row: u32, c: u32, cols: u32, gs: u32) -> f32 {
    return bitcast<f32>(w[row * cols + c]);
}
