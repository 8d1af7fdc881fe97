// rmsnorm: out[t, s] = (r[t, s] + norm(x[t', s] · pre) · w) · post, with r = 0 (mode 0), the
//   old out[t, s] (mode 1: in place), or res[t, s] (mode 2: the residual stream read from one
//   buffer and written to another, as the fused-norm qmv of decode steps does, qmv_norm.wgsl)
//   where norm(v) = v · (mean(v²) + eps)^-½, s is one of `segs` segments of length n per token,
//   and t' = t (x_row_sel 0) or step.out_row0 + t (x_row_sel 1: the rows the LM head reads).
//   chain = c ∈ 1..3 (segs 1): then also out{2,3,4}[t] = norm(out[t]) · w{2,3,4} · post{2,3,4}
//   for the first c of them: the next blocks' input norms of the residual stream this norm just
//   updated (the next layer's input norm; or a MoE layer's pre-MLP, router and pre-expert norms,
//   all of the same rows), from the values still in registers: one dispatch instead of 1 + c,
//   the same arithmetic as separate rmsnorms over out, bitwise.
// One kernel covers every norm of the layer: input norms (mode 0), sandwich post-norms folded
// into the residual add (mode 1, post = layer_scalar on the layer's last add), the PLE
// projection norm (segs = n_layers, pre = hidden^-½, post = 2^-½ over the token term in out),
// and the final norm. Decode and verify steps run it; prefill chunks run rmsnorm_rows.wgsl (the
// same outputs, shaped for many rows) unless the tuning's rows_norms is off.
//
// Bindings: x: f32[count, x_stride]; wt: f32[..] all norm weights of the model, this one at
//   w_off (NO_WEIGHT: scale-free norm), the chained ones at w2_off, w3_off, w4_off; out:
//   f32[count, out_stride]; out2, out3, out4: f32[count, out2_stride] (those past `chain`: any
//   buffer); p: NormParams; step: Step; res: f32[count, out_stride] (mode 2; else any buffer).
//   (Bindings 9 and 10, rmsnorm_rows.wgsl's group sums and split-k partials, are in the layout
//   every rmsnorm form shares and unused here.)
// Launch: WG threads per (segment, token); grid = (segs, count).
// Why a fixed-order reduction (reduce_tree.wgsl, or reduce_subgroup.wgsl where the device has
// subgroups): results must not depend on the chunk a token was run in.
// Why the unrolled register block (ledger: 2026-11-30 loads-in-flight, 2026-12-01
// rmsnorm-v-sized): a decode step runs this kernel on one
// workgroup per norm, so its time is the latency of its loads; every value a thread needs (its
// first V values of x, their weights, the residual, the chained norm's weights) is loaded at
// once into registers before any is used, instead of a loop that waits on each load in turn.
// The host sizes V to the row (kernels::rmsnorm: ceil(n / WG), at most 12, so no register
// waits for a value past it); rows past V · WG values take a plain loop (correct, slower; no
// Gemma 4 norm is that wide).

const WG: u32 = {{WG}}u; // 512 where the device allows (the default), 1024 or 256: kernels::rmsnorm
const V: u32 = {{V}}u;
const NO_WEIGHT: u32 = 0xffffffffu;

// NormParams: norm_params.wgsl (prepended by the host).

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> wt: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> out2: array<f32>;
@group(0) @binding(4) var<storage, read_write> out3: array<f32>;
@group(0) @binding(5) var<storage, read_write> out4: array<f32>;
@group(0) @binding(6) var<uniform> p: NormParams;
@group(0) @binding(7) var<uniform> step: Step;
@group(0) @binding(8) var<storage, read> res: array<f32>;

var<workgroup> red: array<f32, WG>;


// Writes and returns out[ob + i].
fn finish(y0: f32, i: u32, ob: u32) -> f32 {
    var y = y0;
    if (p.w_off != NO_WEIGHT) { y *= wt[p.w_off + i]; }
    if (p.mode == 1u) { y += out[ob + i]; }
    if (p.mode == 2u) { y += res[ob + i]; }
    y *= p.post;
    out[ob + i] = y;
    return y;
}

const SG: u32 = {{SG}}u; // subgroup size (1 without subgroups): reduce_subgroup.wgsl's
// {{WORKGROUP_SUM}}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let seg = wid.x;
    let t = wid.y;
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    if (t >= count) { return; }
    let xr = select(t, step.out_row0 + t, p.x_row_sel == 1u);
    let xb = xr * p.x_stride + seg * p.n;
    let ob = t * p.out_stride + seg * p.n;
    // Every load of the register block is issued here, before any value is used: the weights,
    // the residual (mode 1) and the chained norm's weights arrive while the sum is reduced.
    // (Loads placed after the stores of the output pass waited on them, one round trip each.)
    let has_w = p.w_off != NO_WEIGHT;
    let resid = p.mode >= 1u;
    let in_place = p.mode == 1u;
    let chain = p.chain >= 1u;
    let chain3 = p.chain >= 2u;
    let chain4 = p.chain >= 3u;
    // @unroll k V
    var v{k} = 0.0;
    var w{k} = 1.0;
    var o{k} = 0.0;
    var c{k} = 0.0;
    var d{k} = 0.0;
    var e{k} = 0.0;
    if (lid + {k}u * WG < p.n) {
        v{k} = x[xb + lid + {k}u * WG];
        if (has_w) { w{k} = wt[p.w_off + lid + {k}u * WG]; }
        if (in_place) { o{k} = out[ob + lid + {k}u * WG]; } else if (resid) { o{k} = res[ob + lid + {k}u * WG]; }
        if (chain) { c{k} = wt[p.w2_off + lid + {k}u * WG]; }
        if (chain3) { d{k} = wt[p.w3_off + lid + {k}u * WG]; }
        if (chain4) { e{k} = wt[p.w4_off + lid + {k}u * WG]; }
    }
    // @end k
    // Only now is a loaded value used: a use inside the block above would wait for its load
    // before the next block's loads are issued (the compiler does not move work across the
    // blocks' branches): one memory round trip per value a thread holds.
    var ss = 0.0;
    // @unroll k V
    v{k} *= p.pre;
    ss += v{k} * v{k};
    // @end k
    for (var i = lid + V * WG; i < p.n; i += WG) {
        let v = x[xb + i] * p.pre;
        ss += v * v;
    }
    let r = 1.0 / sqrt(workgroup_sum(ss, lid) / f32(p.n) + p.eps);
    // finish()'s arithmetic, from registers.
    // @unroll k V
    if (lid + {k}u * WG < p.n) {
        var y = v{k} * r;
        if (has_w) { y *= w{k}; }
        if (resid) { y += o{k}; }
        y *= p.post;
        out[ob + lid + {k}u * WG] = y;
        v{k} = y;
    }
    // @end k
    for (var i = lid + V * WG; i < p.n; i += WG) {
        finish(x[xb + i] * p.pre * r, i, ob);
    }
    if (!chain) { return; }
    // The chained norm of the updated rows (this thread's own writes are read back past V · WG).
    var ss2 = 0.0;
    // @unroll k V
    ss2 += v{k} * v{k};
    // @end k
    for (var i = lid + V * WG; i < p.n; i += WG) {
        let v = out[ob + i];
        ss2 += v * v;
    }
    let r2 = 1.0 / sqrt(workgroup_sum(ss2, lid) / f32(p.n) + p.eps);
    let ob2 = t * p.out2_stride;
    // @unroll k V
    if (lid + {k}u * WG < p.n) {
        let i = lid + {k}u * WG;
        out2[ob2 + i] = v{k} * r2 * c{k} * p.post2;
        if (chain3) { out3[ob2 + i] = v{k} * r2 * d{k} * p.post3; }
        if (chain4) { out4[ob2 + i] = v{k} * r2 * e{k} * p.post4; }
    }
    // @end k
    for (var i = lid + V * WG; i < p.n; i += WG) {
        let y = out[ob + i] * r2;
        out2[ob2 + i] = y * wt[p.w2_off + i] * p.post2;
        if (chain3) { out3[ob2 + i] = y * wt[p.w3_off + i] * p.post3; }
        if (chain4) { out4[ob2 + i] = y * wt[p.w4_off + i] * p.post4; }
    }
}
