// MatmulParams of qmv's gated form (qmv.wgsl, qmv_gelu_b): the matmul params, then where the
// gating row of `gb` is (mirrors `QmvGeluParams` in kernels.rs).
struct MatmulParams {
    rows: u32,
    cols: u32,
    gs: u32,
    x_stride: u32,
    y_stride: u32,
    y_off: u32,
    count_sel: u32,
    k_splits: u32,
    b_stride: u32,  // f32 elements between tokens in gb
    b_off: u32,     // first element of the gating row
    _pad0: u32,
    _pad1: u32,
}
