// prefetch: the prefetch role of a latency-bound decode kernel (rmsnorm.wgsl,
// attention_combine.wgsl). Such a kernel runs a few workgroups through a chain of dependent
// loads and barriers while the rest of the GPU idles, and the weights of the mat-vec that
// follows do not depend on it: `wgs` extra workgroups read the first `n` vec4s of them (`pf`,
// declared by the kernel), so that the mat-vec finds them in L2 (PERF_NOTES.md, session 13).
//
// prefetch(i, lid, n, wgs): extra workgroup i's share, 8 loads in flight per thread (WG
// threads, declared by the kernel). Returns whether the caller must store something: never, as
// the host never passes wgs = PF_NEVER, but the answer depends on what was read, so the
// compiler cannot drop the loads as dead code.

const PF_NEVER: u32 = 0xffffffffu;

fn prefetch(i: u32, lid: u32, n: u32, wgs: u32) -> bool {
    let stride = wgs * WG;
    let last = n - 1u;
    var h = vec4<u32>(0u);
    for (var b = i * WG + lid; b < n; b += 8u * stride) {
        // @unroll k 8
        let v{k} = pf[min(b + {k}u * stride, last)];
        // @end k
        h ^= ((v0 ^ v1) ^ (v2 ^ v3)) ^ ((v4 ^ v5) ^ (v6 ^ v7));
    }
    return wgs == PF_NEVER && h.x == 0u;
}
