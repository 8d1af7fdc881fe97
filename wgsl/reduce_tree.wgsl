// workgroup_sum (tree): the workgroup's sum of `ss` over its WG threads by a fixed tree in
// workgroup memory (`red`: array<f32, WG>, declared by the kernel), log2(WG) + 2 barriers. For
// devices without subgroup operations; reduce_subgroup.wgsl otherwise. Every thread must call it.
fn workgroup_sum(ss: f32, lid: u32) -> f32 {
    red[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    let total = red[0];
    // `red` is reused by the next call: every thread has read the total first.
    workgroupBarrier();
    return total;
}

// workgroup_max (tree): the same shape for the maximum (attention_short.wgsl's softmax).
fn workgroup_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    return mx;
}

// subgroup_sum (no subgroups: SG = 1): a lane's own value, the sum over its subgroup of one.
fn subgroup_sum(v: f32) -> f32 { return v; }
