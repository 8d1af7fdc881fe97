// qmv_norm: the fused-norm prologue of qmv.wgsl (PRO): before its mat-vec, each workgroup forms
// its input from the residual stream itself, for each of its TOK tokens t (N = 4 · N4 values):
//   h[t] = (res[t] + norm(a[t]) · w1) · post1        the residual after a sandwich norm
//   v[t] = norm(h[t]) · w2 · post2   (second)        the next block's input norm, or
//   v[t] = h[t]                      (no second)
// with norm(u) = u · (mean(u²) + eps)^-½, a = the kernel's `x` binding (the branch output: o
// of attention, the MLP's down projection, the per-layer projection), and stores v in workgroup
// memory, where the loop reads it (xload). Workgroup 0 of each token tile also writes h to
// res_out: the residual stream ping-pongs between two buffers, so no workgroup reads what
// another writes in the same dispatch.
// Why (ledger: 2026-11-30 skip-dispatches): a residual norm as its own dispatch cost ≈ 5.5 µs
// of an E2B decode step (decode steps that skip them: 3288 → 2708 µs for 105 norms); here it
// costs a few loads from L2 and two workgroup sums before the loop. Measured, that wins at E2B's
// hidden size (1536: 306 → 339 tok/s) and loses at 2560 and 2816 (E4B, 26B: 207 → 198,
// 202 → 184; ledger: 2026-11-30 fuse-norms-2048, 2026-11-30 fused-norm-kv-shared-q): every
// workgroup reads 16 bytes per input value before its first weight load, and the wider
// consumers have more workgroups (ledger: 2026-11-30 fused-norm-lean, 2026-11-30
// fused-norm-no-weights). With 32-lane teams, by consumer at 2560 (ledger: 2026-12-02
// fuse-norms-max-wg, 2026-12-03 fuse-wide-gated): the gated per-layer gate (64 workgroups)
// gains, the GeGLU and the plain q|k|v do not;
// the host fuses every kind up to PRO_MAX_HIDDEN and past it the gate (kernels::fuse_norm_into).
// The sums reduce over the workgroup in a fixed order that does not depend on TOK: decode and
// verify tiles form bitwise-equal inputs (and so bitwise-equal rows).
//
// Bindings (after the kernel's): res: f32[count, N] as vec4; nw: f32[..] all norm weights as
//   vec4, w1 at value offset np.w1, w2 at np.w2 (multiples of 4); res_out: f32[count, N] as vec4;
//   np: NormPro.
// Host guarantees: the matrix's cols = N = a's and res's row length; TOK · N4 vec4s fit in
//   workgroup memory beside `red`.

struct NormPro {
    w1: u32,
    post1: f32,
    w2: u32,
    post2: f32,
    eps: f32,
    second: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding({{PB}}) var<storage, read> res: array<vec4<f32>>;
@group(0) @binding({{PB1}}) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding({{PB2}}) var<storage, read_write> res_out: array<vec4<f32>>;
@group(0) @binding({{PB3}}) var<uniform> np: NormPro;

const KV: u32 = {{KV}}u; // vec4s per thread: ceil(N4 / WG)

// v of token t lives in qmv_digits.wgsl's xw as [t][vec4 j of a chunk][chunk]: the loop's lanes
// read consecutive chunks' j-th vec4s, consecutive addresses (stored as the row is,
// [t][chunk][j], each lane's reads were 128 bytes apart: bank conflicts, the first fused form
// lost 30-60 % to them: ledger: 2026-11-30 fused-norm-row-order, 2026-11-30
// fused-norm-chunk-layout). Held as bits: in the DIGITS form each chunk's slots are rewritten
// in place with its digits (qmv_digits.wgsl).
fn xw_index(t: u32, k: u32) -> u32 {
    return t * N4 + (k & 7u) * NCHUNK + (k >> 3u);
}

// The loop's i = t · N4 + 8 · chunk + j (xrows[t] = t · N4).
fn xload(i: u32) -> vec4<f32> {
    let t = select(0u, i / N4, TOK > 1u);
    return bitcast<vec4<f32>>(xw[xw_index(t, i - t * N4)]);
}

// A norm weight's vec4 at value offset `off` (a multiple of 4): one 16-byte load instead of four
// scalar ones took fused decode steps from 316 to 322 tok/s on E2B (ledger: 2026-11-30
// norm-weights-vec4).
fn nw4(off: u32) -> vec4<f32> {
    return nw[off / 4u];
}

// workgroup_sum: the norms' sums, as rmsnorm.wgsl reduces them (qmv_core.wgsl declares SG and
// `red`, which is free again when it returns).
// {{WORKGROUP_SUM}}

// Every thread calls it. `write`: this workgroup writes res_out for tokens t0 + t < count.
fn qmv_prologue(lid: u32, write: bool, t0: u32, count: u32) {
    let n = f32(N4 * 4u);
    // @unroll t TOK
    {
        let tt = min(t0 + {t}u, count - 1u);
        let ab = tt * (p.x_stride / 4u);
        let rb = tt * N4;
        // Every load is issued before any is used (one L2 round trip, not one per vec4).
        // @unroll k KV
        let i{k} = min(lid + {k}u * WG, N4 - 1u);
        let a{k} = x[ab + i{k}];
        let r{k} = res[rb + i{k}];
        let w{k} = nw4(np.w1 + 4u * i{k});
        var c{k} = vec4<f32>(1.0);
        if (np.second != 0u) { c{k} = nw4(np.w2 + 4u * i{k}); }
        // @end k
        var ss = 0.0;
        // @unroll k KV
        if (lid + {k}u * WG < N4) { ss += dot(a{k}, a{k}); }
        // @end k
        let inv1 = 1.0 / sqrt(workgroup_sum(ss, lid) / n + np.eps);
        var ss2 = 0.0;
        // @unroll k KV
        let h{k} = ((a{k} * inv1) * w{k} + r{k}) * np.post1;
        if (lid + {k}u * WG < N4) {
            if (write && t0 + {t}u < count) { res_out[rb + i{k}] = h{k}; }
            ss2 += dot(h{k}, h{k});
        }
        // @end k
        var inv2 = 1.0;
        if (np.second != 0u) { inv2 = 1.0 / sqrt(workgroup_sum(ss2, lid) / n + np.eps); }
        // @unroll k KV
        if (lid + {k}u * WG < N4) {
            var v = h{k};
            if (np.second != 0u) { v = ((h{k} * inv2) * c{k}) * np.post2; }
            xw[xw_index({t}u, i{k})] = bitcast<vec4<u32>>(v);
        }
        // @end k
    }
    // @end t
    workgroupBarrier();
    if (DIGITS) {
        // Each chunk becomes its digits once per workgroup (a thread reads all 8 of its slots
        // before it writes any; no two threads share a chunk).
        for (var k = lid; k < TOK * NCHUNK; k += WG) {
            let b = (k / NCHUNK) * N4 + k % NCHUNK;
            // @unroll j 8
            let v{j} = bitcast<vec4<f32>>(xw[b + {j}u * NCHUNK]);
            // @end j
            store_digits(b, v0, v1, v2, v3, v4, v5, v6, v7);
        }
        workgroupBarrier();
    }
}
