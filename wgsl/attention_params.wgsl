// attention_params: the params struct shared by attention.wgsl, attention_split.wgsl and
// attention_combine.wgsl (prepended by the host; mirrors `AttnParams` in kernels.rs).

struct AttnParams {
    d: u32,
    n_heads: u32,
    n_kv_heads: u32,
    slots: u32,
    window: u32,   // 0: full attention
    n_splits: u32, // key splits of attention_split / attention_combine (unused by attention)
    _pad1: u32,
    _pad2: u32,
}
