// team_sum (subgroups of SG ≥ TPK): the sum of `v` over the TPK consecutive lanes of lid's team
// by a shuffle-xor butterfly inside the subgroup (no barrier); the team's first lane's result is
// the one attention_short.wgsl uses (the lanes add in different orders). Every lane must call it.
fn team_sum(v: f32, lid: u32) -> f32 {
    var s = v;
    for (var h = TPK / 2u; h > 0u; h >>= 1u) { s += subgroupShuffleXor(s, h); }
    return s;
}
