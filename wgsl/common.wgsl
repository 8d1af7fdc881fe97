// common: declarations every kernel shares, prepended by the host to each kernel's source.
//
// Step: the per-step uniform (binding `step` of every kernel): the step's token count, the
// position of its first token, and the rows the LM head produces (the last n_out of the step,
// starting at out_row0 = n_tokens − n_out), and whether the step is a speculative verify.

struct Step {
    n_tokens: u32,
    pos0: u32,
    n_out: u32,
    out_row0: u32,
    staged: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// The row of a K/V cache holding position `pos`. Caches are rings of `slots` rows (sliding
// layers; full layers have a slot per position) followed by staging rows: in a verify step
// (step.staged = 1) the step's own positions live in the staging rows, so candidate K/V never
// overwrite committed entries; the host copies the accepted ones into the ring afterwards.
// Kernels that call it bind `step`.
fn kv_row(pos: u32, slots: u32) -> u32 {
    if (step.staged != 0u && pos >= step.pos0) { return slots + (pos - step.pos0); }
    return pos % slots;
}
