// Weight format q4: MLX affine 4-bit, group size gs (a multiple of 64; host-checked).
// w: u32[rows * cols / 8], 8 values per word, element j of a word at bits 4j..4j+3.
// scales, biases: bf16[rows * cols / gs], two per u32 word (element 2i in the low half).
// Value: w = scale * q + bias, in f32 (scale_at, bias_at: groups.wgsl, prepended with it).
// Prepended to kernels that declare `w`, `scales`, `biases` as storage arrays of u32.

// The 8 values of row `row`, columns 8*c8 .. 8*c8+7.
fn load8(row: u32, c8: u32, cols: u32, gs: u32) -> array<f32, 8> {
    let word = w[row * (cols / 8u) + c8];
    let g = row * (cols / gs) + (c8 * 8u) / gs;
    let s = scale_at(g);
    let b = bias_at(g);
    var out: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        out[j] = s * f32((word >> (4u * j)) & 0xfu) + b;
    }
    return out;
}

// Value of row `row`, column `c` (tails; unused while cols % gs == 0, kept for a uniform interface).
fn load1(row: u32, c: u32, cols: u32, gs: u32) -> f32 {
    let word = w[row * (cols / 8u) + c / 8u];
    let g = row * (cols / gs) + c / gs;
    return scale_at(g) * f32((word >> (4u * (c % 8u))) & 0xfu) + bias_at(g);
}
