// attention_params: the params struct shared by attention.wgsl, attention_split.wgsl,
// attention_combine.wgsl and attention_short.wgsl (prepended by the host; mirrors `AttnParams`
// in kernels.rs), the sliding-window rule they share and which decode kernel owns a row.

struct AttnParams {
    d: u32,
    n_heads: u32,
    n_kv_heads: u32,
    slots: u32,
    window: u32,   // 0: full attention
    n_splits: u32, // key splits of attention_split / attention_combine (unused by attention)
    short_max: u32, // rows of ≤ short_max keys are attention_short's, the others attention_split's
    _pad2: u32,
}

// The first position a query at `pos` attends to: 0 (full attention, window 0) or the oldest
// of the window's positions ending at pos.
fn first_key(pos: u32, window: u32) -> u32 {
    if (window > 0u && pos + 1u > window) { return pos + 1u - window; }
    return 0u;
}

// Whether attention_short (rows of at most short_max keys) or attention_split + combine
// computes the row of a query at `pos` (WgpuBackend::encode mirrors it for one-row steps).
fn short_row(pos: u32) -> bool {
    return pos + 1u - first_key(pos, p.window) <= p.short_max;
}
