// halves: the f16 split every tensor-core kernel (qmm_coop_core.wgsl, attention_coop.wgsl)
// applies to its f32 operands, prepended by the host after the enable directives.
//
// v = high(v) + low · 2^-11 with high(v) = v's mantissa cut to f16's 10 bits (exact in f16; 0
// below f16's normal range, 2^-14) and the low half stored as (v − high(v)) · 2^11, so that it
// is as far from f16's subnormals as the high half (the H200 loses subnormal f16 halves:
// ledger: 2026-11-30 qmm-coop-three-mma).
fn high(v: vec4<f32>) -> vec4<f32> {
    let h = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xffffe000u));
    return select(h, vec4<f32>(0.0), abs(v) < vec4<f32>(6.103515625e-05));
}
