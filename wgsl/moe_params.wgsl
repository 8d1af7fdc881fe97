// MoeMatmulParams: the params of the two routed-expert kernels (moe_matmul.wgsl per pair,
// moe_matmul_grouped.wgsl per expert), prepended to both by the host. Mirrors the Rust struct
// of the same name in src/backend/wgpu/kernels.rs.

struct MoeMatmulParams {
    rows: u32,
    cols: u32,
    gs: u32,
    expert_stride: u32,
    row_off: u32,
    top_k: u32,
    x_tok_stride: u32,
    x_slot_stride: u32,
    y_stride: u32,
    group_stride: u32, // words between moe_group's lists (moe_matmul_grouped, qmm_moe)
    up_off: u32,       // the up rows of a fused gate_up stack (qmv_moe_glu only)
    n_groups: u32,     // lists in `groups` (qmm_moe only)
}
