// argmax_common: what softcap_argmax.wgsl and argmax_merge.wgsl share (prepended by the host):
// the params struct (mirrors `ArgmaxParams` in kernels.rs) and the workgroup's (value, index)
// tree.

const WG: u32 = 256u;

struct ArgmaxParams {
    vocab: u32,
    cap: f32,
    chunks: u32, // ceil(vocab / CH): softcap_argmax's workgroups per row, argmax_merge's pairs
    _pad0: u32,
}

var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;

// The workgroup's first maximum of the WG threads' (value, index) pairs, left in bv[0], bi[0]:
// a fixed tree that keeps the larger value, or on equal values the lower index. Every thread
// calls it (barriers).
fn argmax_tree(best_v: f32, best_i: u32, lid: u32) {
    bv[lid] = best_v;
    bi[lid] = best_i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = bv[lid + s];
            let oi = bi[lid + s];
            if (ov > bv[lid] || (ov == bv[lid] && oi < bi[lid])) { bv[lid] = ov; bi[lid] = oi; }
        }
        workgroupBarrier();
    }
}
