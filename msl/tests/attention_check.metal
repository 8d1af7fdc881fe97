// attention_check: one query head as decode_step finishes and attends it (`head_finish`, then
// `attend_head` of decode.metal, which this file is compiled after), for tests/metal_kernels.rs
// to check against `crate::reference::{rmsnorm, rope, attend}`.
//
// Buffers: 0 q       coherent(device) device float*  the raw q head (d values), normed and roped
//                                                  in place
//          1 k, 2 v  coherent(device) device float*  cache rows [slots][d] (position p at p % slots)
//          3 out     coherent(device) device float*  the attention output (d values)
//          4 p       device const uint*  [0] d, [1] first position, [2] last position, [3] slots,
//                                        [4] eps (f32 bits), then q_norm's d weights (f32 bits),
//                                        then the rope's d/2 cos and d/2 sin (f32 bits)
// Launch: one SIMD-group (1 × 32).
#include <metal_stdlib>
using namespace metal;

kernel void attention_check(coherent(device) device float* q [[buffer(0)]],
                            coherent(device) device float* k [[buffer(1)]],
                            coherent(device) device float* v [[buffer(2)]],
                            coherent(device) device float* out [[buffer(3)]],
                            device const uint* p [[buffer(4)]],
                            uint lane [[thread_index_in_simdgroup]]) {
    uint d = p[0];
    float eps = as_type<float>(p[4]);
    head_finish(q, q, p, 5u, true, p, 5u + d, d, eps, lane);
    attend_head(q, k, v, out, p[1], p[2], p[3], d, d, lane);
}
