// attention_coop: attention.wgsl (chunk attention: prefill) on tensor cores (cooperative matrices)
//   o[t, h] = Σ_p softmax_p(q[t, h] · K[p, kvh]) · V[p, kvh]   (scale 1.0, Gemma 4)
// for token t at position P = pos0 + t, query head h, kv head kvh = h / (n_heads / n_kv_heads),
// over positions p in [first_key(P, window), P], with attention.wgsl's bindings, params, ring
// cache and masks (the host prepends `enable f16; enable wgpu_cooperative_matrix;`, halves.wgsl,
// common.wgsl and attention_params.wgsl, and substitutes D).
//
// Bindings: q: f32[n_tokens, n_heads * D]; kc, vc: f32[slots, n_kv_heads * D] (all read as vec4);
//   o: f32[n_tokens, n_heads * D]; p: AttnParams (p.d = D); step: Step; osum (SUMS = 1 only):
//   f32[n_tokens, n_heads * D / 64], the sums of each 64 values of o (a value stage: one
//   quantisation group of the o projection's x, which reads them instead of a group_sum pass).
// Launch: WG = 256 threads = 8 subgroups of exactly 32 (host guarantees it) per (head, tile of
//   BQ = 32 tokens); grid = (n_heads, ceil(n_tokens / BQ)).
// Host guarantees: D % 64 == 0, D ≤ 512; |q|, |k|, |v| < 2^15 (f16's range for the halves).
//
// Flash attention in 64-key tiles: per tile, S = Q·Kᵀ (BQ × 64) on tensor cores, the online
// softmax by plain threads, then O += P·V on tensor cores, O kept in the subgroups' accumulators
// for the whole kernel.
// - Exactness (as qmm_coop_core.wgsl; ledger: 2026-12-01 attention-coop): every f16 operand is a
//   pair of halves, v = hi + lo · 2^-11 (hi: v's mantissa cut to 10 bits, 0 below f16's normal
//   range; lo stored scaled by 2^11, away from the subnormals the H200 drops); the products hi·hi +
//   (lo·hi + hi·lo) · 2^-11 leave ~2^-21 of each product. Scores keep the two sums apart (two
//   accumulators per block); O, with P ≤ e^TAU, takes all three products into one accumulator of
//   2^11 · O: (2^11 P_hi)·V_hi + (2^11 P_lo)·V_hi + P_hi·(2^11 V_lo), every operand exact in f16,
//   and is divided by 2^11 · l at the end.
// - The running maximum: coop blocks cannot be scaled per row, so O is rescaled (stored,
//   scaled by plain threads, loaded back) only when a row's tile maximum passes its running
//   maximum by more than TAU; otherwise the old maximum stays and P ≤ e^TAU. Softmax is the
//   same for any subtracted constant, so this is exact, not an approximation.
// - Workgroup memory (45 KiB of the H200's 48): `stg` holds one 64-dim stage of the tile's queries
//   and keys as halves ([row][dim]), then one 64-dim value stage, transposed ([dim][key]) so that V
//   is loaded exactly as K is (column-major B, qmm_coop's pattern; a row-major B load of [key][dim]
//   misplaced columns on the H200, though while `need` below was still misaligning the arrays:
//   ledger: 2026-12-01 coop-wg-vars-16b); `ssc` the tile's scores, then one 16 × 16 O block per
//   subgroup when O is rescaled or stored; `pst` the weights' halves. Every workgroup variable is a
//   multiple of 16 bytes (see `need`).
// Roles: subgroup sg owns score block (query block sg % 2, key block sg / 2) and, per value
// stage c, the O block of query block sg % 2 and dims 64c + 16 (sg / 2) ..; softmax thread
// (r, c) = (lid / 8, lid % 8) holds query r's keys 8c..8c+7 and its running max and sum (the
// row's 8 threads agree bit for bit: butterflies over lanes of one subgroup).

const BQ: u32 = 32u;            // queries per workgroup: two blocks of 16
const WG: u32 = 256u;           // threads
const NSG: u32 = 8u;            // subgroups
const SR: u32 = WG / 16u;       // rows a staging pass covers (16 threads per 64-value row)
const BK: u32 = 64u;
const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const NC: u32 = D / 64u;        // value stages (64 dims each) per tile
const SV: u32 = 18u;            // vec4<f16> per staged row: 64 values + 8 halves of padding
const PV: u32 = 18u;            // vec4<f16> per row of weights: 64 keys + 8 halves of padding
const SS: u32 = BK + 4u;        // f32 per score row (padded: fewer bank conflicts)
const QH: u32 = 0u;             // stg offsets (vec4<f16>): score stage
const QL: u32 = BQ * SV;
const KH: u32 = 2u * BQ * SV;
const KL: u32 = 2u * BQ * SV + BK * SV;
const VH: u32 = 0u;             // value stage
const VL: u32 = 64u * SV;
const PH: u32 = 0u;             // pst offsets: P_hi, P_lo · 2^11
const PL: u32 = BQ * PV;
const NEG: f32 = -3.0e38;
const LO: f32 = 0.00048828125;  // 2^-11
const TAU: f32 = 2.0;           // P ≤ e^2: 2^11 P_hi stays far inside f16's range

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;
// @unroll s SUMS
@group(0) @binding(6) var<storage, read_write> osum: array<f32>;
// @end s

var<workgroup> stg: array<vec4<f16>, 2u * (BQ + BK) * SV>; // q and key rows, or value rows, × 2 halves
var<workgroup> ssc: array<f32, BQ * SS>;      // scores [query][key]; O blocks [sg][16 × 16]
var<workgroup> pst: array<vec4<f16>, 2u * BQ * PV>;
var<workgroup> krow: array<u32, BK>;          // vec4 offset of each key of the tile in the cache
var<workgroup> rowc: array<f32, BQ>;          // per query: the tile's rescale factor, then its sum
// @unroll s SUMS
var<workgroup> osg: array<f32, BQ * 4u>;      // per query: one value stage's 4 dim blocks' sums
// @end s
var<workgroup> sgneed: array<u32, 8>;
// The rescale flag, in .x. 16 bytes, not 4, as every workgroup variable here is a multiple of 16
// bytes: on the H200 a 4-byte flag among them made the tensor-core score loads read wrong values,
// and the same kernel with the flag 16 bytes wide is right (ledger: 2026-12-01 coop-wg-vars-16b).
// Likely the driver packs the variables and the loads need 16-byte-aligned rows; the validation
// test in kernels.rs holds every tensor-core kernel to the rule.
var<workgroup> need: vec4<u32>;

fn split(v: vec4<f32>, at_hi: u32, at_lo: u32) {
    let h = high(v);
    stg[at_hi] = vec4<f16>(h);
    stg[at_lo] = vec4<f16>((v - h) * 2048.0);
}

// Value stage c holds the tile's 64 keys × dims 64c .. 64c + 63, transposed ([dim][key]: the
// score stage's layout with dims for keys, so that V is loaded as K is), in 256 groups of 4 keys
// × 4 dims: group g = keys 4 (g / 16) .. + 3 × dims 4 (g % 16) .. + 3, four vec4 loads along
// dims (y: the key) stored as four vec4s along keys. Thread lid stages group lid.
fn value_load(c: u32, g: u32, y: u32) -> vec4<f32> {
    return vc[krow[4u * (g / 16u) + y] + c * 16u + g % 16u];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let lid = sg * 32u + lane;
    let h = wid.x;
    let t0 = wid.y * BQ;
    let n = step.n_tokens;
    if (t0 >= n) { return; }
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let kv4 = p.n_kv_heads * D4;
    // Softmax role; rows past the step's last token compute its row again and store nothing.
    let r = lid / 8u;
    let c = lid % 8u;
    let pos_r = step.pos0 + min(t0 + r, n - 1u);
    let lo_r = first_key(pos_r, p.window);
    // Staging role: q rows sr + SR u (u < 2), key rows sr + SR u (u < 4), vec4 sq of each stage.
    let sr = lid / 16u;
    let sq = lid % 16u;
    // @unroll u 2
    let qo{u} = (min(t0 + sr + {u}u * SR, n - 1u) * p.n_heads + h) * D4 + sq;
    // @end u
    let sb = sg % 2u;
    let kb = sg / 2u;
    // Every key in [k_start, k_end) is attended by some query of the tile.
    let k_start = first_key(step.pos0 + t0, p.window);
    let k_end = step.pos0 + min(t0 + BQ, n);
    var m = NEG;
    var l = 0.0;
    // O block c: query block sb, dims 64c + 16 kb .. (value stage c).
    // @unroll c NC
    var o{c} = coop_mat16x16<f32, C>();
    // @end c
    for (var base = k_start; base < k_end; base += BK) {
        if (lid < BK) { krow[lid] = kv_row(min(base + lid, k_end - 1u), p.slots) * kv4 + kvh * D4; }
        workgroupBarrier();
        // S = Q·Kᵀ in 64-dim stages; the next stage's loads issued before this one's products.
        // @unroll u 4
        let kr{u} = krow[sr + {u}u * SR] + sq;
        var kv{u} = kc[kr{u}];
        // @end u
        // @unroll u 2
        var qv{u} = q[qo{u}];
        // @end u
        var sh = coop_mat16x16<f32, C>();
        var sl = coop_mat16x16<f32, C>();
        for (var d0 = 0u; d0 < D4; d0 += 16u) {
            // @unroll u 2
            split(qv{u}, QH + (sr + {u}u * SR) * SV + sq, QL + (sr + {u}u * SR) * SV + sq);
            // @end u
            // @unroll u 4
            split(kv{u}, KH + (sr + {u}u * SR) * SV + sq, KL + (sr + {u}u * SR) * SV + sq);
            // @end u
            workgroupBarrier();
            let dn = min(d0 + 16u, D4 - 16u); // after the last stage: a harmless reload
            // @unroll u 2
            qv{u} = q[qo{u} + dn];
            // @end u
            // @unroll u 4
            kv{u} = kc[kr{u} + dn];
            // @end u
            for (var kk = 0u; kk < 16u; kk += 4u) {
                let ah = coopLoadT<coop_mat16x16<f16, A>>(&stg[QH + sb * 16u * SV + kk], SV);
                let al = coopLoadT<coop_mat16x16<f16, A>>(&stg[QL + sb * 16u * SV + kk], SV);
                let bh = coopLoad<coop_mat16x16<f16, B>>(&stg[KH + kb * 16u * SV + kk], SV);
                let bl = coopLoad<coop_mat16x16<f16, B>>(&stg[KL + kb * 16u * SV + kk], SV);
                sl = coopMultiplyAdd(al, bh, sl);
                sl = coopMultiplyAdd(ah, bl, sl);
                sh = coopMultiplyAdd(ah, bh, sh);
            }
            workgroupBarrier();
        }
        // The first value stage's loads, in flight during the softmax.
        // @unroll y 4
        var vv{y} = value_load(0u, lid, {y}u);
        // @end y
        coopStoreT(sh + sl * LO, &ssc[sb * 16u * SS + kb * 16u], SS);
        workgroupBarrier();

        // Online softmax: row r's keys 8c + i.
        // @unroll i 8
        let key{i} = base + c * 8u + {i}u;
        let ok{i} = key{i} < k_end && key{i} >= lo_r && key{i} <= pos_r;
        let s{i} = select(NEG, ssc[r * SS + c * 8u + {i}u], ok{i});
        // @end i
        var tmax = max(max(max(s0, s1), max(s2, s3)), max(max(s4, s5), max(s6, s7)));
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        tmax = max(tmax, subgroupShuffleXor(tmax, 2u));
        tmax = max(tmax, subgroupShuffleXor(tmax, 4u));
        let grow = tmax > m + TAU;
        let new_m = select(m, tmax, grow);
        // @unroll i 8
        let e{i} = select(0.0, exp(s{i} - new_m), ok{i});
        // @end i
        var ps = ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7));
        ps += subgroupShuffleXor(ps, 1u);
        ps += subgroupShuffleXor(ps, 2u);
        ps += subgroupShuffleXor(ps, 4u);
        let corr = exp(m - new_m);
        l = l * corr + ps;
        // O holds this row's earlier keys only when m was set (a row without keys yet has O = 0).
        let rescale = subgroupAny(grow && m > NEG);
        m = new_m;
        let ea = vec4<f32>(e0, e1, e2, e3);
        let eb = vec4<f32>(e4, e5, e6, e7);
        let ha = high(ea);
        let hb = high(eb);
        pst[PH + r * PV + 2u * c] = vec4<f16>(ha);
        pst[PH + r * PV + 2u * c + 1u] = vec4<f16>(hb);
        pst[PL + r * PV + 2u * c] = vec4<f16>((ea - ha) * 2048.0);
        pst[PL + r * PV + 2u * c + 1u] = vec4<f16>((eb - hb) * 2048.0);
        if (c == 0u) { rowc[r] = corr; }
        if (lane == 0u) { sgneed[sg] = u32(rescale); }
        workgroupBarrier();
        if (lid == 0u) {
            var flag = 0u;
            for (var i = 0u; i < NSG; i++) { flag |= sgneed[i]; }
            need = vec4<u32>(flag);
        }
        // Rare after the first tiles: each O block through the subgroup's slot of `ssc` (the
        // scores are read by now), its rows scaled by their factors.
        if (workgroupUniformLoad(&need).x != 0u) {
            // @unroll c NC
            coopStoreT(o{c}, &ssc[sg * 256u], 16u);
            workgroupBarrier();
            for (var e = lane; e < 256u; e += 32u) { ssc[sg * 256u + e] *= rowc[sb * 16u + e / 16u]; }
            workgroupBarrier();
            o{c} = coopLoadT<coop_mat16x16<f32, C>>(&ssc[sg * 256u], 16u);
            workgroupBarrier();
            // @end c
        }

        // O += P·V, 64 dims (a value stage) at a time, 16 keys per product.
        // @unroll c NC
        // @unroll x 4
        split(vec4<f32>(vv0[{x}], vv1[{x}], vv2[{x}], vv3[{x}]), VH + (4u * (lid % 16u) + {x}u) * SV + lid / 16u, VL + (4u * (lid % 16u) + {x}u) * SV + lid / 16u);
        // @end x
        workgroupBarrier();
        // @unroll y 4
        vv{y} = value_load(min({c}u + 1u, NC - 1u), lid, {y}u);
        // @end y
        for (var kk = 0u; kk < 16u; kk += 4u) {
            let ph = coopLoadT<coop_mat16x16<f16, A>>(&pst[PH + sb * 16u * PV + kk], PV);
            let pl = coopLoadT<coop_mat16x16<f16, A>>(&pst[PL + sb * 16u * PV + kk], PV);
            let bh = coopLoad<coop_mat16x16<f16, B>>(&stg[VH + kb * 16u * SV + kk], SV);
            let bl = coopLoad<coop_mat16x16<f16, B>>(&stg[VL + kb * 16u * SV + kk], SV);
            o{c} = coopMultiplyAdd(ph * 2048.0h, bh, o{c});
            o{c} = coopMultiplyAdd(pl, bh, o{c});
            o{c} = coopMultiplyAdd(ph, bl, o{c});
        }
        // Also orders this tile's reads of krow, pst and rowc before the next tile's writes.
        workgroupBarrier();
        // @end c
    }

    // o = (2^11 · O) / (2^11 · l), each block through the subgroup's slot of `ssc`. SUMS = 1:
    // a value stage's 64 dims of a query are one group of the o projection's x: the 4 lanes
    // that hold a row's 16 dims of a block add them by butterfly, the stage's 4 blocks (kb)
    // meet in `osg`, and thread r < BQ adds them in order into osum.
    if (c == 0u) { rowc[r] = l * 2048.0; }
    workgroupBarrier();
    // @unroll c NC
    coopStoreT(o{c}, &ssc[sg * 256u], 16u);
    workgroupBarrier();
    // @unroll n PLAIN
    for (var e = lane; e < 64u; e += 32u) {
        let row = sb * 16u + e / 4u;
        if (t0 + row < n) {
            let f = sg * 256u + 4u * e;
            let v = vec4<f32>(ssc[f], ssc[f + 1u], ssc[f + 2u], ssc[f + 3u]);
            o[((t0 + row) * p.n_heads + h) * D4 + 16u * {c}u + 4u * kb + e % 4u] = v / rowc[row];
        }
    }
    // @end n
    // @unroll s SUMS
    for (var e = lane; e < 64u; e += 32u) {
        let row = sb * 16u + e / 4u;
        let f = sg * 256u + 4u * e;
        let v = vec4<f32>(ssc[f], ssc[f + 1u], ssc[f + 2u], ssc[f + 3u]) / rowc[row];
        if (t0 + row < n) {
            o[((t0 + row) * p.n_heads + h) * D4 + 16u * {c}u + 4u * kb + e % 4u] = v;
        }
        var s = (v.x + v.y) + (v.z + v.w);
        s += subgroupShuffleXor(s, 1u);
        s += subgroupShuffleXor(s, 2u);
        if (e % 4u == 0u) { osg[row * 4u + kb] = s; }
    }
    workgroupBarrier();
    if (lid < BQ && t0 + lid < n) {
        osum[((t0 + lid) * p.n_heads + h) * NC + {c}u] = ((osg[lid * 4u] + osg[lid * 4u + 1u]) + osg[lid * 4u + 2u]) + osg[lid * 4u + 3u];
    }
    // @end s
    // (SUMS: `osg` is written again after the next stage's barrier.) `ssc` after this one.
    workgroupBarrier();
    // @end c
}
