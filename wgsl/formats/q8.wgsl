// Weight format q8: MLX affine 8-bit, group size gs (a multiple of 64; host-checked).
// w: u32[rows * cols / 4], 4 values per word, element j of a word at bits 8j..8j+7.
// scales, biases: bf16[rows * cols / gs], two per u32 word (element 2i in the low half).
// Value: w = scale * q + bias, in f32 (scale_at, bias_at: groups.wgsl, prepended with it).

fn load8(row: u32, c8: u32, cols: u32, gs: u32) -> array<f32, 8> {
    let base = row * (cols / 4u) + 2u * c8;
    let g = row * (cols / gs) + (c8 * 8u) / gs;
    let s = scale_at(g);
    let b = bias_at(g);
    var out: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let word = w[base + j / 4u];
        out[j] = s * f32((word >> (8u * (j % 4u))) & 0xffu) + b;
    }
    return out;
}

// Value of row `row`, column `c` (tails; unused while cols % gs == 0, kept for a uniform interface).
fn load1(row: u32, c: u32, cols: u32, gs: u32) -> f32 {
    let word = w[row * (cols / 4u) + c / 4u];
    let g = row * (cols / gs) + c / gs;
    return scale_at(g) * f32((word >> (8u * (c % 4u))) & 0xffu) + bias_at(g);
}
