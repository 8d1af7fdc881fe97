// spec_rows: the rows a speculative round moves once spec_accept has decided (positions and counts
// from the round state, spec_params.wgsl), in three modes:
//   0  commit: the accepted rows of a K/V cache, staging row r → ring row (pos + r) % slots for
//      r ≤ n (the host's `commit`, on the GPU); src and dst are the same cache, bound twice is not
//      allowed, so the cache is `dst` and `src` is unused;
//   1  the hidden row that produced the next token: src row n → dst (at dst_off), the drafter's
//      first hidden input;
//   2  rope rows: src row (pos' + t) % ring → dst row t, t < rows (the host keeps the ring
//      filled ahead of any position a round in flight can reach).
//
// Bindings: src: f32[…]; dst: f32[…]; state: u32[5]; p: SpecParams; step: Step (unused, bound
//   for the shared prelude).
// Launch: 256 threads, a grid-stride loop over rows × elems; grid = (x, 1), any x.

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> state: array<u32>;
@group(0) @binding(3) var<uniform> p: SpecParams;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = state[1];
    let rows = select(select(p.rows, 1u, p.mode == 1u), n + 1u, p.mode == 0u);
    let total = rows * p.elems;
    for (var i = gid.x; i < total; i += nwg.x * 256u) {
        let r = i / p.elems;
        let e = i - r * p.elems;
        if (p.mode == 0u) {
            let to = (state[2] + r) % p.slots;
            dst[to * p.elems + e] = dst[(p.slots + r) * p.elems + e];
        } else if (p.mode == 1u) {
            dst[p.dst_off + e] = src[n * p.elems + e];
        } else {
            let row = (state[0] + r) % p.ring;
            dst[p.dst_off + r * p.elems + e] = src[row * p.elems + e];
        }
    }
}
