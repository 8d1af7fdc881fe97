// argmax_params: the params struct of softcap_argmax.wgsl and argmax_merge.wgsl (prepended by
// the host; mirrors `ArgmaxParams` in kernels.rs).

struct ArgmaxParams {
    vocab: u32,
    cap: f32,
    chunks: u32, // ceil(vocab / CH): softcap_argmax's workgroups per row, argmax_merge's pairs
    _pad0: u32,
}
