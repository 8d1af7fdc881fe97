        // (attention_key_subgroup_sum.wgsl) Lane j adds key j's NSG subgroup sums in order.
        var s = NEG;
        if (lid < n_valid) {
            s = 0.0;
            for (var i = 0u; i < NSG; i++) { s += sred[lid * NSG + i]; }
        }
