// team_sum (no subgroups, or subgroups narrower than a team): the sum of `v` over the TPK
// consecutive lanes of lid's team by a fixed tree in `red` (log2(TPK) + 2 barriers). Every
// thread of the workgroup must call it.
fn team_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var h = TPK / 2u; h > 0u; h >>= 1u) {
        if (lid % TPK < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let s = red[lid - lid % TPK];
    workgroupBarrier();
    return s;
}
