        // (attention_key_tree_sum.wgsl) A fixed tree adds each key's 64 partials (no subgroups).
        for (var hw = WG / 2u; hw > 0u; hw >>= 1u) {
            if (lid < hw) {
                for (var j = 0u; j < n_valid; j++) { sred[j * WG + lid] += sred[j * WG + lid + hw]; }
            }
            workgroupBarrier();
        }
        var s = NEG;
        if (lid < n_valid) { s = sred[lid * WG]; }
