// attention (chunks: prefill and verify): o[t, h] = Σ_p softmax_p(q[t, h] · K[p, kvh]) · V[p, kvh]
//   (scale 1.0, Gemma 4) for token t at position P = pos0 + t, query head h, kv head
//   kvh = h / (n_heads / n_kv_heads), over positions p in [lo, P]: lo = 0 (full layers) or
//   max(0, P + 1 − window) (sliding layers).
// The cache is a ring: position p lives in row kv_row(p, slots) = p % slots, or a staging row in a
// verify step (common.wgsl) (slots ≥ window + chunk for sliding layers, so a chunk's own writes
// never evict a position one of its queries still needs).
//
// Bindings: q: f32[n_tokens, n_heads * d]; kc, vc: f32[slots, n_kv_heads * d] (all read as vec4);
//   o: f32[n_tokens, n_heads * d]; p: AttnParams; step: Step.
// Launch: 256 threads per (head, tile of BQ = 16 tokens); grid = (n_heads, ceil(n_tokens / 16)).
// Host guarantees: d % 4 == 0, d ≤ 512; DV = ceil(d / 64) (64-dim slices of a row), DW = ceil(d / 256).
//
// Why register tiles (ledger: 2026-11-30 attention-chunk-v2, 2026-12-01 attention-chunk-pipelined,
// 2026-12-01 attention-register-tiles): 16 queries share each 64-key tile, staged 64 dims at a
// time in workgroup memory (rows padded by one vec4: distinct banks), so each K and V row is
// read from memory once per 16 queries. The pipelined form before it gave each thread 1 query ×
// 4 keys and 1 query × 4 value vec4s, so every workgroup-memory read fed ≤ 4 FMAs and those reads
// bounded it (7.1 TFLOP/s); with the tiles below it runs at ≈ 10 (H200, 512-token chunk, d 256:
// 151.8 → 108.1 µs).
// The tiles:
// - scores: thread (dq, qg, kg) = (lid / 64, lid / 16 % 4, lid % 16) owns 4 queries (4qg + a)
//   × 4 keys (kg + 16b) over one quarter of each staged 64-dim slice (vec4s 4dq..4dq+3): 8 reads
//   per 16 dot products instead of 5 per 4. The four quarters' partial scores meet in workgroup
//   memory (in the key buffer, free by then) and are added in quarter order;
// - softmax: thread (r, c) = (lid / 16, lid % 16) holds query r's keys c + 16k;
// - values: thread (g, v) = (lid / 64, lid % 64) owns 4 queries (4g + a) × value vec4s v + 64w
//   (w < DW = ceil(d / 256)); the weights are read as vec4s along keys and the values staged KS =
//   16 / DW keys × whole rows at a time: 4 + 4·DW reads per 16·DW vec4 FMAs.
// Thread roles change between phases; every exchange goes through workgroup memory across a barrier.
const BQ: u32 = 16u;
const BK: u32 = 64u;
const DV: u32 = {{DV}}u; // 64-dim slices of a row (the score phase)
const DW: u32 = {{DW}}u; // value vec4s per thread and query
const KS: u32 = 16u / DW; // keys per value slice
const VW: u32 = 64u * DW; // vec4s per staged value row
const NEG: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;

const RP: u32 = 17u; // vec4s per staged 64-dim row: 16 + 1 of padding (distinct banks)

// The tile's unnormalised weights, [query][key / 4] as vec4s along keys.
var<workgroup> sc: array<vec4<f32>, BQ * BK / 4u>;
// One 64-dim slice of the tile's queries: [query][dim / 4].
var<workgroup> qs: array<vec4<f32>, BQ * RP>;
// One 64-dim slice of its keys ([key][dim / 4]); then the partial scores ([quarter][query][key]
// as floats); then KS keys' value rows ([key][VW]).
var<workgroup> ks: array<vec4<f32>, BK * RP>;
// vec4 offset of each key of the tile in the cache (its row and kv head).
var<workgroup> krow: array<u32, BK>;
// Per-thread partials of a query row ([r][c]): the tile's maxima, then the final row sums.
var<workgroup> part: array<vec4<f32>, BQ * 4u>;
// Per query row: the tile's rescale factor e^(m − m'), then the row's final sum.
var<workgroup> rowv: array<f32, BQ>;

// Value vec4 `i` of a value slice (KS keys from key `k0` of the tile), zero past d.
fn value_load(k0: u32, i: u32, d4: u32) -> vec4<f32> {
    let v = i % VW;
    return select(vec4<f32>(0.0), vc[krow[k0 + i / VW] + min(v, d4 - 1u)], v < d4);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t0 = wid.y * BQ;
    let n = step.n_tokens;
    if (t0 >= n) { return; }
    let d4 = p.d / 4u;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let kv4 = p.n_kv_heads * d4;
    // Staging and softmax role (r, c); rows past the step's last token compute the last token's
    // row again and store nothing.
    let r = lid / 16u;
    let c = lid % 16u;
    let t = min(t0 + r, n - 1u);
    let qb = (t * p.n_heads + h) * d4;
    let pos = step.pos0 + t;
    let lo = first_key(pos, p.window);
    // Score role.
    let dq = lid / 64u;
    let qg = (lid / 16u) % 4u;
    let kg = lid % 16u;
    // Value role.
    let g = lid / 64u;
    let vv = lid % 64u;
    // Every key in [k_start, k_end) is attended by some query of the tile.
    let k_start = first_key(step.pos0 + t0, p.window);
    let k_end = step.pos0 + min(t0 + BQ, n);
    var m = NEG;
    var l = 0.0; // this thread's keys' share of row r's sum
    // @unroll a 4
    // @unroll w DW
    var acc{a}_{w} = vec4<f32>(0.0);
    // @end w
    // @end a
    for (var base = k_start; base < k_end; base += BK) {
        if (lid < BK) { krow[lid] = kv_row(min(base + lid, k_end - 1u), p.slots) * kv4 + kvh * d4; }
        workgroupBarrier();
        let kr0 = krow[r];
        let kr1 = krow[r + 16u];
        let kr2 = krow[r + 32u];
        let kr3 = krow[r + 48u];
        var qv = vec4<f32>(0.0);
        // @unroll k 4
        var kv{k} = vec4<f32>(0.0);
        // @end k
        if (c < d4) {
            qv = q[qb + c];
            // @unroll k 4
            kv{k} = kc[kr{k} + c];
            // @end k
        }
        // @unroll a 4
        // @unroll b 4
        var s{a}{b} = 0.0;
        // @end b
        // @end a
        // @unroll u DV
        {
            qs[r * RP + c] = qv;
            // @unroll k 4
            ks[(r + {k}u * 16u) * RP + c] = kv{k};
            // @end k
            workgroupBarrier();
            // The next slice's loads; after the last one, the first value slice's.
            if ({u}u + 1u < DV) {
                let nd = ({u}u + 1u) * 16u + c;
                let valid = nd < d4;
                qv = select(vec4<f32>(0.0), q[qb + min(nd, d4 - 1u)], valid);
                // @unroll k 4
                kv{k} = select(vec4<f32>(0.0), kc[kr{k} + min(nd, d4 - 1u)], valid);
                // @end k
            } else {
                // @unroll k 4
                kv{k} = value_load(0u, lid + {k}u * 256u, d4);
                // @end k
            }
            for (var ii = 0u; ii < 4u; ii++) {
                let i = dq * 4u + ii;
                // @unroll a 4
                let qa{a} = qs[(qg * 4u + {a}u) * RP + i];
                // @end a
                // @unroll b 4
                let kb{b} = ks[(kg + {b}u * 16u) * RP + i];
                // @end b
                // @unroll a 4
                // @unroll b 4
                s{a}{b} += dot(qa{a}, kb{b});
                // @end b
                // @end a
            }
            workgroupBarrier();
        }
        // @end u
        // The quarters' partial scores, as floats [dq][query][key] in ks.
        // @unroll a 4
        // @unroll b 4
        {
            let f = (dq * 16u + qg * 4u + {a}u) * BK + kg + {b}u * 16u;
            ks[f / 4u][f % 4u] = s{a}{b};
        }
        // @end b
        // @end a
        workgroupBarrier();
        // Softmax role: query r's keys c + 16k, summed over the quarters in order.
        // @unroll k 4
        var e{k} = 0.0;
        {
            let f = r * BK + c + {k}u * 16u;
            let s = ((ks[f / 4u][f % 4u] + ks[(f + 1024u) / 4u][f % 4u]) + ks[(f + 2048u) / 4u][f % 4u]) + ks[(f + 3072u) / 4u][f % 4u];
            let key = base + c + {k}u * 16u;
            e{k} = select(NEG, s, key >= lo && key <= pos);
        }
        // @end k
        part[r * 4u + c / 4u][c % 4u] = max(max(e0, e1), max(e2, e3));
        workgroupBarrier();
        let pa = max(part[r * 4u], part[r * 4u + 1u]);
        let pb = max(part[r * 4u + 2u], part[r * 4u + 3u]);
        let pc = max(pa, pb);
        let new_m = max(m, max(max(pc.x, pc.y), max(pc.z, pc.w)));
        let corr = exp(m - new_m);
        // @unroll k 4
        {
            let key = base + c + {k}u * 16u;
            let w = select(0.0, exp(e{k} - new_m), key >= lo && key <= pos);
            sc[r * 16u + (c + {k}u * 16u) / 4u][c % 4u] = w;
            e{k} = w;
        }
        // @end k
        l = l * corr + ((e0 + e1) + (e2 + e3));
        m = new_m;
        if (c == 0u) { rowv[r] = corr; }
        // Value role: the slices of KS keys.
        for (var vs = 0u; vs < BK / KS; vs++) {
            // @unroll k 4
            ks[{k}u * 256u + lid] = kv{k};
            // @end k
            workgroupBarrier();
            if (vs == 0u) {
                // @unroll a 4
                {
                    let cr = rowv[g * 4u + {a}u];
                    // @unroll w DW
                    acc{a}_{w} *= cr;
                    // @end w
                }
                // @end a
            }
            if (vs + 1u < BK / KS) {
                // @unroll k 4
                kv{k} = value_load((vs + 1u) * KS, lid + {k}u * 256u, d4);
                // @end k
            }
            for (var jj = 0u; jj < KS; jj += 4u) {
                // @unroll a 4
                let pw{a} = sc[(g * 4u + {a}u) * 16u + (vs * KS + jj) / 4u];
                // @end a
                // @unroll b 4
                // @unroll w DW
                let vr{b}_{w} = ks[(jj + {b}u) * VW + vv + {w}u * 64u];
                // @end w
                // @end b
                // @unroll a 4
                // @unroll w DW
                acc{a}_{w} += pw{a}.x * vr0_{w} + pw{a}.y * vr1_{w} + pw{a}.z * vr2_{w} + pw{a}.w * vr3_{w};
                // @end w
                // @end a
            }
            // Also orders this tile's reads of krow, sc, rowv and part before the next tile's writes.
            workgroupBarrier();
        }
    }
    // The row sums: the 16 shares of each row (all scaled to the same final maximum).
    part[r * 4u + c / 4u][c % 4u] = l;
    workgroupBarrier();
    if (c == 0u) {
        let sv = (part[r * 4u] + part[r * 4u + 1u]) + (part[r * 4u + 2u] + part[r * 4u + 3u]);
        rowv[r] = (sv.x + sv.y) + (sv.z + sv.w);
    }
    workgroupBarrier();
    // @unroll a 4
    if (t0 + g * 4u + {a}u < n) {
        let ob = ((t0 + g * 4u + {a}u) * p.n_heads + h) * d4;
        let total = rowv[g * 4u + {a}u];
        // @unroll w DW
        if (vv + {w}u * 64u < d4) { o[ob + vv + {w}u * 64u] = acc{a}_{w} / total; }
        // @end w
    }
    // @end a
}
