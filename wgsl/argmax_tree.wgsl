// argmax_tree: the workgroup's (value, index) argmax tree, shared by softcap_argmax.wgsl,
// argmax_merge.wgsl and router_topk.wgsl (prepended by the host). The kernel declares WG (its
// workgroup size, a power of two).

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
