// moe_norm: the close of a Gemma 4 MoE block in one workgroup per token (decode and verify
// steps), in place of three dependent dispatches — the dense branch's post-norm (rmsnorm mode 0),
// moe_combine and the routed branch's post-norm added onto it (rmsnorm mode 1):
//   m[t]  = Σ_j weight[t, j] · eo[t · K + j]                          (j in slot order)
//   out[t] = (norm(dense[t]) · w1 · post1 + norm(m[t]) · w2) · post2
// where norm(v) = v · (mean(v²) + eps)^-½. Each step is that kernel's arithmetic in its order
// (moe_combine's sum; rmsnorm's registers, per-thread sums and workgroup_sum on the same WG and
// V), so the output is bitwise what the three dispatches write (tested), and chunks, which
// keep the three, agree with decode as before.
//
// The residual form (RESID) goes on to the block's residual post-norm and its chained norms,
// rmsnorm mode 2 on the sum above, from registers (m is not stored):
//   out[t] = (res[t] + norm(m'[t]) · np.w · np.post),  out2..4[t] = norm(out[t]) · w2..4 · post2..4
// (np: the NormParams that norm would run with, chain ≤ 3): four dispatches in one.
//
// Bindings: dense: f32[count, n] (the dense MLP's output); eo: f32[count · K, n] (the routed
//   experts' outputs, slot-major per token); weight: f32[count, K] (the router's weights);
//   wt: f32[..] all norm weights of the model, w1 at w1_off and w2 at w2_off; out: f32[count,
//   n] (the sum; in the residual form, the residual stream out); p: MoeNormParams; step: Step.
//   Residual form: res: f32[count, n] (the residual stream in); out2, out3, out4: f32[count,
//   np.out2_stride] (those past np.chain: any buffer); np: NormParams (rmsnorm's fields n,
//   w_off, post, eps, chain, w2–4_off, post2–4, out2_stride).
// Launch: WG threads per token (kernels::rmsnorm's choice for n, V = ceil(n / WG) values per
//   thread); grid = (1, count). Host guarantees n ≤ V · WG.
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
const NO_WEIGHT: u32 = 0xffffffffu;

@group(0) @binding(0) var<storage, read> dense: array<f32>;
@group(0) @binding(1) var<storage, read> eo: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> wt: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: MoeNormParams;
@group(0) @binding(6) var<uniform> step: Step;
// {{RESID_BINDINGS}}

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
    // @unroll x RESID
    let has_w = np.w_off != NO_WEIGHT;
    let chain = np.chain >= 1u;
    let chain3 = np.chain >= 2u;
    let chain4 = np.chain >= 3u;
    // @end x
    // @unroll k V
    var a{k} = 0.0;
    var w1_{k} = 1.0;
    var w2_{k} = 1.0;
    // @unroll j K
    var e{k}_{j} = 0.0;
    // @end j
    // @unroll x RESID
    var w{k} = 1.0;
    var o{k} = 0.0;
    var c{k} = 0.0;
    var d{k} = 0.0;
    var f{k} = 0.0;
    // @end x
    if (lid + {k}u * WG < p.n) {
        let i = lid + {k}u * WG;
        a{k} = dense[b + i];
        w1_{k} = wt[p.w1_off + i];
        w2_{k} = wt[p.w2_off + i];
        // @unroll j K
        e{k}_{j} = eo[(t * K + {j}u) * p.n + i];
        // @end j
        // @unroll x RESID
        if (has_w) { w{k} = wt[np.w_off + i]; }
        o{k} = res[b + i];
        if (chain) { c{k} = wt[np.w2_off + i]; }
        if (chain3) { d{k} = wt[np.w3_off + i]; }
        if (chain4) { f{k} = wt[np.w4_off + i]; }
        // @end x
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
    var v{k} = 0.0;
    if (lid + {k}u * WG < p.n) {
        var y1 = a{k} * r1;
        y1 *= w1_{k};
        y1 *= p.post1;
        var y = m{k} * r2;
        y *= w2_{k};
        y += y1;
        y *= p.post2;
        v{k} = y;
        // @unroll x PLAIN
        out[b + lid + {k}u * WG] = y;
        // @end x
    }
    // @end k
    // @unroll x RESID
    // The residual post-norm (rmsnorm mode 2) and its chained norms, rmsnorm's arithmetic on
    // the sum in registers.
    var ss3 = 0.0;
    // @unroll k V
    v{k} *= np.pre;
    ss3 += v{k} * v{k};
    // @end k
    let r3 = 1.0 / sqrt(workgroup_sum(ss3, lid) / f32(p.n) + np.eps);
    // @unroll k V
    if (lid + {k}u * WG < p.n) {
        var y = v{k} * r3;
        if (has_w) { y *= w{k}; }
        y += o{k};
        y *= np.post;
        out[b + lid + {k}u * WG] = y;
        v{k} = y;
    }
    // @end k
    if (!chain) { return; }
    var ss4 = 0.0;
    // @unroll k V
    ss4 += v{k} * v{k};
    // @end k
    let r4 = 1.0 / sqrt(workgroup_sum(ss4, lid) / f32(p.n) + np.eps);
    let b2 = t * np.out2_stride;
    // @unroll k V
    if (lid + {k}u * WG < p.n) {
        let i = lid + {k}u * WG;
        out2[b2 + i] = v{k} * r4 * c{k} * np.post2;
        if (chain3) { out3[b2 + i] = v{k} * r4 * d{k} * np.post3; }
        if (chain4) { out4[b2 + i] = v{k} * r4 * f{k} * np.post4; }
    }
    // @end k
    // @end x
}
