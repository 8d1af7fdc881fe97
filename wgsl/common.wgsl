// common: declarations every kernel shares, prepended by the host to each kernel's source.
//
// Step: the per-step uniform (binding `step` of every kernel): the step's token count, the
// position of its first token, and the rows the LM head produces (the last n_out of the step,
// starting at out_row0 = n_tokens − n_out).

struct Step {
    n_tokens: u32,
    pos0: u32,
    n_out: u32,
    out_row0: u32,
}
