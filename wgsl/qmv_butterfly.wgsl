    // qmv_reduce's butterfly (inserted into qmv_core.wgsl at `// {{BUTTERFLY}}` where the device
    // has subgroups of one fixed size SG): the lanes of a team inside one subgroup add their
    // partials by shuffle-xor, BFLY = min(LANES, SG) lanes, no barrier or workgroup memory.
    for (var h = BFLY / 2u; h > 0u; h >>= 1u) {
        // @unroll i RPT_TOK
        v{i} += subgroupShuffleXor(v{i}, h);
        // @end i
    }
