// gelu: GELU with the tanh approximation (gelu_pytorch_tanh, Gemma 4's hidden_activation),
// shared by gelu_mul.wgsl and the GeGLU forms of qmv.wgsl and qmv_moe.wgsl.
// gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))); tanh is computed from exp so that large
// |x| saturate cleanly instead of relying on the platform tanh.

fn tanh_stable(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * (1.0 - e) / (1.0 + e);
}

fn gelu_tanh(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tanh_stable(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
