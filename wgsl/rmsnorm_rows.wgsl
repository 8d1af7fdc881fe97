// rmsnorm_rows: the chunk form of rmsnorm.wgsl (kernels::Kernel::RmsNormRows), with its
//   bindings, params and outputs: out[t, s] = (r[t, s] + norm(x[t', s] · pre) · w) · post
//   (modes 0–2), out{2,3,4}[t] = norm(out[t]) · w{2,3,4} · post{2,3,4} for the first `chain`
//   of them, and with SUMS each asked-for output's sums over groups of p.gs values
//   (xsum[p.sum_off{j} + t · G + g], G = n / gs: what the tensor-core mat-mats read).
//   rmsnorm.wgsl documents the fields.
// PARTS = 1 (Kernel::RmsNormRows { parts: true }): x[t] is read as the sum of a split-k
//   mat-mat's p.splits partials, part[(s · count + t) · n ..], added in qmm_sum.wgsl's order
//   (bitwise the x qmm_sum would have written), so that the qmm_sum dispatch goes. In a
//   decode-shaped norm that cost more than it saved (ledger: 2026-12-01 norm-split-partials: one
//   workgroup per token with too few loads in flight); here it is S vec4 loads per value in flight.
// Why a second form (ledger: 2026-12-01 rows-norms): rmsnorm.wgsl is shaped for a decode step,
//   where one workgroup is the whole norm and its time is the latency of its loads (256
//   threads, every value of six arrays loaded into registers before any is used). A prefill
//   chunk runs it on hundreds of rows at once, and there that shape cost ≈ 23 µs per E4B norm
//   (512 × 2560) for ≈ 6 µs of bytes. Here a row has fewer threads (WG), each loading V4 vec4s
//   per array, and only the arrays the first output needs are loaded up front: the chained
//   weights are loaded when their stage starts, before the sum they wait on. Measured on the
//   H200: ≈ 14 µs per E4B norm in the chunk at WG = 256 (2.95 → 1.81 ms per chunk; 128 threads
//   2.10, 64 threads 2.73).
// Arithmetic: each value as rmsnorm.wgsl computes it (y = x · pre · r · w + o, then · post;
//   the chained outputs y · r2 · w_j · post_j), but the sums of squares are added in another
//   order (four values per thread, then the workgroup's), so the outputs are within tol::NORM
//   of the decode form's, not bitwise. Decode and verify steps keep rmsnorm.wgsl (verify must
//   equal decode bitwise; a chunk's rows need not: its mat-mats already differ). The order is
//   fixed, so a token's rows do not depend on the chunk it ran in. Group sums: each thread's
//   vec4 as (a + b) + (c + d), then a group's gs / 4 of those in order.
// Host guarantees (kernels::rmsnorm_rows): n, the row strides and the weight offsets are
//   multiples of 4 (rows of vec4); n ≤ 4 · V4 · WG; SUMS: segs = 1, gs a multiple of 4, n a
//   multiple of gs; PARTS: segs = 1, x_stride = n, x_row_sel = count_sel = 0, splits ≥ 2.
// Bindings: as rmsnorm.wgsl's, the f32 arrays read as vec4 (x, wt, out, out2..out4, res);
//   PARTS: part: vec4<f32>[splits · count · n / 4] (10), x then unread.
// Launch: WG threads per (segment, token); grid = (segs, count).

const WG: u32 = {{WG}}u; // 64, 128 or 256: kernels::rmsnorm_rows
const V4: u32 = {{V4}}u; // vec4s per thread and array: ceil(n / (4 · WG))
const NO_WEIGHT: u32 = 0xffffffffu;

// NormParams: norm_params.wgsl (prepended by the host).

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wt: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out2: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out3: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(6) var<uniform> p: NormParams;
@group(0) @binding(7) var<uniform> step: Step;
@group(0) @binding(8) var<storage, read> res: array<vec4<f32>>;

var<workgroup> red: array<f32, WG>;

// @unroll q PARTS
@group(0) @binding(10) var<storage, read> part: array<vec4<f32>>;
// @end q

// @unroll s SUMS
@group(0) @binding(9) var<storage, read_write> xsum: array<f32>;
// Each thread's vec4 sums of one output, at the vec4's index in the row.
var<workgroup> vsum: array<f32, V4 * WG>;

fn vsum_put(y: vec4<f32>, k: u32, lid: u32) {
    vsum[k * WG + lid] = (y.x + y.y) + (y.z + y.w);
}

// xsum[off + t · G + g] = Σ of group g's gs / 4 entries of `vsum`, in order.
fn group_sums(off: u32, t: u32, lid: u32) {
    workgroupBarrier();
    let per = p.gs / 4u;
    let groups = p.n / p.gs;
    for (var g = lid; g < groups; g += WG) {
        var a = 0.0;
        for (var i = 0u; i < per; i++) { a += vsum[g * per + i]; }
        xsum[off + t * groups + g] = a;
    }
    // `vsum` is written again for the next output.
    workgroupBarrier();
}
// @end s

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
    let n4 = p.n / 4u;
    let xb = (xr * p.x_stride + seg * p.n) / 4u;
    let ob = (t * p.out_stride + seg * p.n) / 4u;
    let has_w = p.w_off != NO_WEIGHT;
    let wb = p.w_off / 4u;
    let resid = p.mode >= 1u;
    let in_place = p.mode == 1u;
    // @unroll q PARTS
    // Partial s of this token: row s · count + t of the partials (t · n: the first one's).
    let pb = t * n4;
    let stride4 = count * n4;
    // @end q
    // Past the row a thread's registers hold 0 (x, the residual) and 1 (the weight): its
    // outputs there are 0, which the group sums may add.
    // @unroll k V4
    var v{k} = vec4(0.0);
    var o{k} = vec4(0.0);
    var w{k} = vec4(1.0);
    if (lid + {k}u * WG < n4) {
        // @unroll q NOPARTS
        v{k} = x[xb + lid + {k}u * WG];
        // @end q
        // @unroll q PARTS
        v{k} = part[pb + lid + {k}u * WG];
        // @end q
        if (has_w) { w{k} = wt[wb + lid + {k}u * WG]; }
        if (in_place) { o{k} = out[ob + lid + {k}u * WG]; } else if (resid) { o{k} = res[ob + lid + {k}u * WG]; }
    }
    // @end k
    // @unroll q PARTS
    for (var s = 1u; s < p.splits; s++) {
        // @unroll k V4
        if (lid + {k}u * WG < n4) { v{k} += part[pb + s * stride4 + lid + {k}u * WG]; }
        // @end k
    }
    // @end q
    var ss = 0.0;
    // @unroll k V4
    v{k} *= p.pre;
    ss += dot(v{k}, v{k});
    // @end k
    let r = 1.0 / sqrt(workgroup_sum(ss, lid) / f32(p.n) + p.eps);
    // @unroll k V4
    v{k} = (v{k} * r * w{k} + o{k}) * p.post;
    if (lid + {k}u * WG < n4) { out[ob + lid + {k}u * WG] = v{k}; }
    // @end k
    // @unroll s SUMS
    if ((p.sums & 1u) != 0u) {
        // @unroll k V4
        vsum_put(v{k}, {k}u, lid);
        // @end k
        group_sums(p.sum_off0, t, lid);
    }
    // @end s
    if (p.chain == 0u) { return; }

    // The chained norms of the rows just written, from the registers. Their weights are loaded
    // first, so that they arrive while the sum of squares is reduced.
    let chain3 = p.chain >= 2u;
    let chain4 = p.chain >= 3u;
    let b2 = p.w2_off / 4u;
    let b3 = p.w3_off / 4u;
    let b4 = p.w4_off / 4u;
    // @unroll k V4
    var c{k} = vec4(0.0);
    var d{k} = vec4(0.0);
    var e{k} = vec4(0.0);
    if (lid + {k}u * WG < n4) {
        c{k} = wt[b2 + lid + {k}u * WG];
        if (chain3) { d{k} = wt[b3 + lid + {k}u * WG]; }
        if (chain4) { e{k} = wt[b4 + lid + {k}u * WG]; }
    }
    // @end k
    var ss2 = 0.0;
    // @unroll k V4
    ss2 += dot(v{k}, v{k});
    // @end k
    let r2 = 1.0 / sqrt(workgroup_sum(ss2, lid) / f32(p.n) + p.eps);
    let ob2 = t * p.out2_stride / 4u;
    // @unroll k V4
    let y2_{k} = v{k} * r2 * c{k} * p.post2;
    if (lid + {k}u * WG < n4) { out2[ob2 + lid + {k}u * WG] = y2_{k}; }
    // @end k
    // @unroll s SUMS
    if ((p.sums & 2u) != 0u) {
        // @unroll k V4
        vsum_put(y2_{k}, {k}u, lid);
        // @end k
        group_sums(p.sum_off1, t, lid);
    }
    // @end s
    if (chain3) {
        // @unroll k V4
        let y3_{k} = v{k} * r2 * d{k} * p.post3;
        if (lid + {k}u * WG < n4) { out3[ob2 + lid + {k}u * WG] = y3_{k}; }
        // @end k
        // @unroll s SUMS
        if ((p.sums & 4u) != 0u) {
            // @unroll k V4
            vsum_put(y3_{k}, {k}u, lid);
            // @end k
            group_sums(p.sum_off2, t, lid);
        }
        // @end s
    }
    if (chain4) {
        // @unroll k V4
        let y4_{k} = v{k} * r2 * e{k} * p.post4;
        if (lid + {k}u * WG < n4) { out4[ob2 + lid + {k}u * WG] = y4_{k}; }
        // @end k
        // @unroll s SUMS
        if ((p.sums & 8u) != 0u) {
            // @unroll k V4
            vsum_put(y4_{k}, {k}u, lid);
            // @end k
            group_sums(p.sum_off3, t, lid);
        }
        // @end s
    }
}
