// matvec_check: the decode step's mat-vec (`matvec` / `quad_dot` of decode.metal, which this file
// is compiled after) alone, for tests/metal_kernels.rs to check against `crate::reference::matmul`
// in every weight format, shape and token count.
//
// Buffers: 0 table  device const uint*  a program table with H_DESC_BASE set and descriptor 0
//                                       the matrix under test (decode.metal's D_* layout)
//          1 wa     device const uint*  the matrix's words (values, or MLX words + scales + biases)
//          2 x      coherent(device) device float*  x, token t at t · cols
//          3 y      coherent(device) device float*  y, token t at t · rows
//          4 p      device const uint*  [0] token count (1 … MAX_M)
// Launch: any grid of whole SIMD-groups; rows are shared out in quads as in decode_step.
#include <metal_stdlib>
using namespace metal;

kernel void matvec_check(device const uint* table [[buffer(0)]],
                         device const uint* wa [[buffer(1)]],
                         coherent(device) device float* x [[buffer(2)]],
                         coherent(device) device float* y [[buffer(3)]],
                         device const uint* p [[buffer(4)]],
                         uint tg [[threadgroup_position_in_grid]],
                         uint ngroups [[threadgroups_per_grid]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint nsg [[simdgroups_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
    Mat m = mat_at(table, 0);
    matvec(m, wa, wa, Rows{x, m.cols}, p[0], y, m.rows, 1.0f, tg * nsg + sg, ngroups * nsg, lane);
}
