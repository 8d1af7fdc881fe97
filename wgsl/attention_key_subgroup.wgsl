                // (attention_key_subgroup.wgsl) Key j0 + g's score: the subgroup's sum of its
                // lanes' partials, one per subgroup into sred[key][subgroup] (NSG of them).
                let ssum = subgroupAdd(s);
                if (lid % SG == 0u) { sred[(j0 + {g}u) * NSG + lid / SG] = ssum; }
