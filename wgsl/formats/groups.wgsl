// groups: the per-group scale and bias of MLX affine quantisation, shared by the q4 and q8
// formats and the 4-bit kernels (qmv_core.wgsl, qmm.wgsl), and the 4-bit kernels' nibble
// unpacking. Prepended to kernels that declare `scales` and `biases` as storage arrays of u32.
// scales, biases: bf16[rows * cols / gs], two per u32 word (element 2i in the low half).

fn scale_at(g: u32) -> f32 { return bf16_pair(scales[g >> 1u], (g & 1u) == 1u); }
fn bias_at(g: u32) -> f32 { return bf16_pair(biases[g >> 1u], (g & 1u) == 1u); }

fn bf16_pair(word: u32, odd: bool) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, odd));
}

// q·16^j for the four nibbles of the low 16 bits of h (nibble j at bits 4j..4j+3), without an
// int→float conversion (a quarter-rate instruction on NVIDIA): the nibble masked in place is
// OR-ed into the mantissa of 2^23, giving exactly 2^23 + q·16^j, and 2^23 is subtracted.
// Callers pre-scale what multiplies it by 16^-j (a power of two: the product is rounded exactly
// as q times it).
fn nibbles(h: u32) -> vec4<f32> {
    let m = vec4<u32>(h) & vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
    return bitcast<vec4<f32>>(m | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}
