// attention_params: the params struct shared by attention.wgsl, attention_split.wgsl and
// attention_combine.wgsl (prepended by the host; mirrors `AttnParams` in kernels.rs), and the
// sliding-window rule they share.

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

// The first position a query at `pos` attends to: 0 (full attention, window 0) or the oldest
// of the window's positions ending at pos.
fn first_key(pos: u32, window: u32) -> u32 {
    if (window > 0u && pos + 1u > window) { return pos + 1u - window; }
    return 0u;
}
