// workgroup_sum (subgroups of SG): the workgroup's sum of `ss` over its WG threads: each
// subgroup's sum (subgroupAdd), then the WG / SG subgroup sums added in order by every thread,
// from `red` (array<f32, WG>, declared by the kernel). Two barriers where the tree takes
// log2(WG) + 2. Deterministic on a given device (the same values in the same lanes give the
// same sum), so a token's result does not depend on its chunk. Relies on subgroups of SG
// consecutive invocations (what Vulkan drivers do for one-dimensional workgroups; the host
// passes SG only when the device reports one fixed size). Every thread must call it. SG is
// declared by the kernel (`const SG: u32 = {{SG}}u;`, the host substitutes it).

fn workgroup_sum(ss: f32, lid: u32) -> f32 {
    let s = subgroupAdd(ss);
    if (lid % SG == 0u) { red[lid / SG] = s; }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG / SG; i++) { total += red[i]; }
    // `red` is reused by the next call: every thread has read the sums first.
    workgroupBarrier();
    return total;
}

// workgroup_max: the same shape for the maximum (attention_short.wgsl's softmax).
fn workgroup_max(v: f32, lid: u32) -> f32 {
    let s = subgroupMax(v);
    if (lid % SG == 0u) { red[lid / SG] = s; }
    workgroupBarrier();
    var mx = red[0];
    for (var i = 1u; i < WG / SG; i++) { mx = max(mx, red[i]); }
    workgroupBarrier();
    return mx;
}

// subgroup_sum: the sum of `v` over the caller's subgroup of SG lanes (every lane must call it).
fn subgroup_sum(v: f32) -> f32 { return subgroupAdd(v); }
