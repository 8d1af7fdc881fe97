                // (attention_key_tree.wgsl) Key j0 + g's lane partials, [key][lane], for the tree.
                sred[(j0 + {g}u) * WG + lid] = s;
