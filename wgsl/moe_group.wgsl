// moe_group: for each expert matrix row group s (an expert, or a cache slot when experts stream),
// the list of routed pairs p = t * top_k + j with idx[p] == s, in ascending p:
//   groups[s * stride] = count, groups[s * stride + 1 + i] = the i-th such p   (i < count).
// Pairs marked SKIP (0xffffffff: computed in another round of a streamed step) match no group.
// The prefill expert kernels (qmm_moe; moe_matmul_grouped for other formats) read these lists,
// so each expert's weights are loaded once per chunk for all of its tokens instead of once per
// (token, expert) pair.
//
// Bindings: idx: u32[n_tokens * top_k]; groups: u32[n_groups * stride] (stride = 1 + max pairs
//   per group ≥ 1 + n_tokens: a token routes to an expert at most once); p: GroupParams; step: Step.
// Launch: 64 threads; one workgroup per group; grid = (n_groups, 1). The pairs are scanned in
//   blocks of 64 with a workgroup prefix sum, so the order is deterministic.

const WG: u32 = 64u;

struct GroupParams {
    top_k: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> idx: array<u32>;
@group(0) @binding(1) var<storage, read_write> groups: array<u32>;
@group(0) @binding(2) var<uniform> p: GroupParams;
@group(0) @binding(3) var<uniform> step: Step;

var<workgroup> scan: array<u32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let s = wid.x;
    let total = step.n_tokens * p.top_k;
    var base = 0u;
    for (var b = 0u; b < total; b += WG) {
        let pi = b + lid;
        var f = 0u;
        if (pi < total && idx[pi] == s) { f = 1u; }
        scan[lid] = f;
        workgroupBarrier();
        // Inclusive Hillis-Steele scan of the 64 flags.
        for (var off = 1u; off < WG; off <<= 1u) {
            var v = scan[lid];
            if (lid >= off) { v += scan[lid - off]; }
            workgroupBarrier();
            scan[lid] = v;
            workgroupBarrier();
        }
        if (f == 1u) { groups[s * p.stride + base + scan[lid]] = pi; }
        base += scan[WG - 1u];
        workgroupBarrier();
    }
    if (lid == 0u) { groups[s * p.stride] = base; }
}
