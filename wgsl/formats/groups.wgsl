// groups: the per-group scale and bias of MLX affine quantisation, shared by the q4 and q8
// formats and the 4-bit kernels (qmv_core.wgsl, qmm.wgsl). Prepended to kernels that declare
// `scales` and `biases` as storage arrays of u32.
// scales, biases: bf16[rows * cols / gs], two per u32 word (element 2i in the low half).

fn scale_at(g: u32) -> f32 { return bf16_pair(scales[g >> 1u], (g & 1u) == 1u); }
fn bias_at(g: u32) -> f32 { return bf16_pair(biases[g >> 1u], (g & 1u) == 1u); }

fn bf16_pair(word: u32, odd: bool) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, odd));
}
