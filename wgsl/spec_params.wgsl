// spec_params: the params of the speculative round's device-side acceptance (spec_accept.wgsl,
// spec_rows.wgsl; prepended by the host; mirrors `SpecParams` in kernels/params.rs), and the
// round-state words they share.
//
// state (u32, written by spec_accept, read by spec_rows): [0] the position the next round starts
// at, [1] the accepted drafts n of the round just verified, [2] the position that round started
// at, [3] the next token; [4] k, the drafts per round (written by the host when rounds start).

struct SpecParams {
    k: u32,        // unused: spec_accept reads k from the round state (it changes per generation)
    elems: u32,    // spec_rows: f32 values per row
    rows: u32,     // spec_rows: rows to move (mode 2), or the most (mode 0: n + 1 of them)
    mode: u32,     // spec_rows: 0 commit K/V, 1 one row at n, 2 rope rows from the ring
    slots: u32,    // mode 0: the cache's ring rows (its staging rows follow them)
    ring: u32,     // mode 2: rows of the rope ring (position q at row q % ring)
    dst_off: u32,  // f32 offset of the destination's first row
    _pad0: u32,
}
