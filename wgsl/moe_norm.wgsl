// moe_norm: the close of a Gemma 4 MoE block in one workgroup per token (decode and verify
// steps), in place of three dependent dispatches — the dense branch's post-norm (rmsnorm mode 0),
// moe_combine and the routed branch's post-norm added onto it (rmsnorm mode 1):
//   m[t]  = Σ_j weight[t, j] · eo[t · K + j]                          (j in slot order)
//   out[t] = (norm(dense[t]) · w1 · post1 + norm(m[t]) · w2) · post2
// where norm(v) = v · (mean(v²) + eps)^-½. Each step is that kernel's arithmetic in its order
// (moe_combine's sum; rmsnorm's registers, per-thread sums and workgroup_sum on the same WG and
// V): bitwise the three dispatches' output on lavapipe; on the H200 last-bit differences
// (ledger: 2026-12-02 moe-norm-nmse: NMSE ≤ 4.6e-15, 52–70 % of values bitwise), which its
// driver contracting a multiply and its add into an FMA in one form and not the other gives, as
// SPIR-V allows
// (tests/kernels.rs holds them to NMSE ≤ 1e-11). Decode and verify both
// run this form, so verify = decode bitwise holds.
// On the H200 (ledger: 2026-12-02 moe-norm): 26B decode 217.6 → 225.5 tok/s.
//
// Bindings: dense: f32[count, n] (the dense MLP's output); eo: f32[count · K, n] (the routed
//   experts' outputs, slot-major per token); weight: f32[count, K] (the router's weights);
//   wt: f32[..] all norm weights of the model, w1 at w1_off and w2 at w2_off; out: f32[count,
//   n]; p: MoeNormParams; step: Step.
// Launch: WG threads per token (kernels::moe_norm's choice: 1024 where the device allows; at
//   512, the decode norms' default, it is slower: ledger: 2026-12-05 norm-threads-512,
//   2026-12-05 norm-threads-split), V = ceil(n / WG)
//   values per thread; grid = (1, count). Host guarantees n ≤ V · WG.
// Why one workgroup and every load first (as rmsnorm.wgsl): a decode step runs it alone, so its
// time is its chain of memory round trips; the dense row, the K expert rows, the weights and the
// router weights are all in flight before the first is used.

struct MoeNormParams {
    n: u32,
    w1_off: u32,
    w2_off: u32,
    eps: f32,
    post1: f32,
    post2: f32,
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = {{WG}}u;
const V: u32 = {{V}}u;
const K: u32 = {{K}}u;

@group(0) @binding(0) var<storage, read> dense: array<f32>;
@group(0) @binding(1) var<storage, read> eo: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> wt: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: MoeNormParams;
@group(0) @binding(6) var<uniform> step: Step;

var<workgroup> red: array<f32, WG>;

const SG: u32 = {{SG}}u; // subgroup size (1 without subgroups): reduce_subgroup.wgsl's
// {{WORKGROUP_SUM}}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let b = t * p.n;
    // @unroll j K
    let g{j} = weight[t * K + {j}u];
    // @end j
    // @unroll k V
    var a{k} = 0.0;
    var w1_{k} = 1.0;
    var w2_{k} = 1.0;
    // @unroll j K
    var e{k}_{j} = 0.0;
    // @end j
    if (lid + {k}u * WG < p.n) {
        let i = lid + {k}u * WG;
        a{k} = dense[b + i];
        w1_{k} = wt[p.w1_off + i];
        w2_{k} = wt[p.w2_off + i];
        // @unroll j K
        e{k}_{j} = eo[(t * K + {j}u) * p.n + i];
        // @end j
    }
    // @end k
    // moe_combine's sum, in slot order (0 past n, as rmsnorm's registers there).
    // @unroll k V
    var m{k} = 0.0;
    if (lid + {k}u * WG < p.n) {
        // @unroll j K
        m{k} += g{j} * e{k}_{j};
        // @end j
    }
    // @end k
    // The dense branch's norm (rmsnorm mode 0, pre 1).
    var ss1 = 0.0;
    // @unroll k V
    ss1 += a{k} * a{k};
    // @end k
    let r1 = 1.0 / sqrt(workgroup_sum(ss1, lid) / f32(p.n) + p.eps);
    // The routed branch's norm onto it (rmsnorm mode 1, pre 1).
    var ss2 = 0.0;
    // @unroll k V
    ss2 += m{k} * m{k};
    // @end k
    let r2 = 1.0 / sqrt(workgroup_sum(ss2, lid) / f32(p.n) + p.eps);
    // @unroll k V
    if (lid + {k}u * WG < p.n) {
        var y1 = a{k} * r1;
        y1 *= w1_{k};
        y1 *= p.post1;
        var y = m{k} * r2;
        y *= w2_{k};
        y += y1;
        y *= p.post2;
        out[b + lid + {k}u * WG] = y;
    }
    // @end k
}
