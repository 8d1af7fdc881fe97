// MatmulParams: the params of matmul.wgsl, qmv.wgsl, qmm.wgsl and qmm_sum.wgsl (one struct, prepended to both, so the
// two kernels are variants of one dispatch with one bind group).
struct MatmulParams {
    rows: u32,      // rows of this weight part
    cols: u32,
    gs: u32,        // quantisation group size (unused for float formats)
    x_stride: u32,  // f32 elements between tokens in x
    y_stride: u32,
    y_off: u32,     // first output column (row offset of this part in the full matrix)
    count_sel: u32, // 0: count = step.n_tokens, 1: count = step.n_out
    k_splits: u32,  // qmm, qmm_sum: ranges the k loop is split into (0 or 1: none)
}
