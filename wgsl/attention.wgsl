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
// Host guarantees: d % 4 == 0, DV = ceil(d / 64) (the vec4s of a row each thread owns).
//
// Why tiles (PERF_NOTES.md, session 5): one workgroup per (head, token) read every key and value
// row once per query and ran the tile's softmax serially in each thread (38 % of an E2B prefill
// chunk). Here 16 queries share each 64-key tile, staged 64 dims at a time in workgroup memory
// (rows padded by one vec4: the 16 keys a quarter-warp reads fall in distinct banks), so each
// K and V row is read from memory once per 16 queries instead of once per query. Thread
// (r, c) = (lid / 16, lid % 16) scores keys c, c + 16, c + 32, c + 48 of the tile for query r
// and accumulates output dims 4c + 64u of query r, u < DV.
// Serial work cut (PERF_NOTES.md, session 11: 6.5 → 7.1 TFLOP/s on the H200): each 64-dim
// slice's loads are issued before the slice before it is computed; a query row's maximum is
// reduced from its 16 threads' partial maxima (4 vec4 reads, not a 64-long scan by each
// thread); each thread keeps its own keys' share of the row sum (all 16 share the row's running
// maximum, so the shares rescale alike), added once at the end; the value sums run as four
// independent chains. What bounds it now is workgroup-memory reads: each value read feeds at
// most 4 FMAs (1 query × 4 keys, 1 query × 4 value vec4s per thread).
const BQ: u32 = 16u;
const BK: u32 = 64u;
const DV: u32 = {{DV}}u;
const NEG: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;

const RP: u32 = 17u; // vec4s per staged row: 16 (64 dims) + 1 of padding

// Unnormalised weights of the tile: [query r][key j].
var<workgroup> sc: array<f32, BQ * BK>;
// 64 dims of the tile's queries and of its keys (then values): [row][dim / 4].
var<workgroup> qs: array<vec4<f32>, BQ * RP>;
var<workgroup> ks: array<vec4<f32>, BK * RP>;
// vec4 offset of each key of the tile in the cache (its row and kv head).
var<workgroup> krow: array<u32, BK>;
// Per-thread partials of a query row ([r][c]): the tile's maxima, then the final row sums.
var<workgroup> part: array<vec4<f32>, BQ * 4u>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t0 = wid.y * BQ;
    let n = step.n_tokens;
    if (t0 >= n) { return; }
    let r = lid / 16u;
    let c = lid % 16u;
    // Rows past the step's last token compute the last token's row again and store nothing.
    let t = min(t0 + r, n - 1u);
    let d4 = p.d / 4u;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let kv4 = p.n_kv_heads * d4;
    let qb = (t * p.n_heads + h) * d4;
    let pos = step.pos0 + t;
    let lo = first_key(pos, p.window);
    // Every key in [k_start, k_end) is attended by some query of the tile (lo and P grow with t).
    let k_start = first_key(step.pos0 + t0, p.window);
    let k_end = step.pos0 + min(t0 + BQ, n);
    var m = NEG;
    var l = 0.0; // this thread's keys' share of the row sum
    // @unroll u DV
    var acc{u} = vec4<f32>(0.0);
    // @end u
    for (var base = k_start; base < k_end; base += BK) {
        if (lid < BK) { krow[lid] = kv_row(min(base + lid, k_end - 1u), p.slots) * kv4 + kvh * d4; }
        workgroupBarrier();
        // Thread (r, c) stages vec4 c of each 64-dim slice of its query row and of keys r,
        // r + 16, r + 32, r + 48 (zero past d); slice u + 1 is loaded while slice u is scored.
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
        var s0 = 0.0;
        var s1 = 0.0;
        var s2 = 0.0;
        var s3 = 0.0;
        // @unroll u DV
        {
            qs[r * RP + c] = qv;
            // @unroll k 4
            ks[(r + {k}u * 16u) * RP + c] = kv{k};
            // @end k
            workgroupBarrier();
            // The next slice's loads; after the last slice, the first values' (same rows).
            let nu = {u}u + 1u;
            let nd = (nu % DV) * 16u + c;
            let valid = nd < d4;
            if (nu < DV) {
                qv = select(vec4<f32>(0.0), q[qb + min(nd, d4 - 1u)], valid);
                // @unroll k 4
                kv{k} = select(vec4<f32>(0.0), kc[kr{k} + min(nd, d4 - 1u)], valid);
                // @end k
            } else {
                // @unroll k 4
                kv{k} = select(vec4<f32>(0.0), vc[kr{k} + min(nd, d4 - 1u)], valid);
                // @end k
            }
            for (var i = 0u; i < 16u; i++) {
                let qi = qs[r * RP + i];
                s0 += dot(qi, ks[c * RP + i]);
                s1 += dot(qi, ks[(c + 16u) * RP + i]);
                s2 += dot(qi, ks[(c + 32u) * RP + i]);
                s3 += dot(qi, ks[(c + 48u) * RP + i]);
            }
            workgroupBarrier();
        }
        // @end u
        let v0 = base + c >= lo && base + c <= pos;
        let v1 = base + c + 16u >= lo && base + c + 16u <= pos;
        let v2 = base + c + 32u >= lo && base + c + 32u <= pos;
        let v3 = base + c + 48u >= lo && base + c + 48u <= pos;
        s0 = select(NEG, s0, v0);
        s1 = select(NEG, s1, v1);
        s2 = select(NEG, s2, v2);
        s3 = select(NEG, s3, v3);
        // The row's maximum over the tile: this thread's four keys, then its row's 16 threads.
        part[r * 4u + c / 4u][c % 4u] = max(max(s0, s1), max(s2, s3));
        workgroupBarrier();
        let pa = max(part[r * 4u], part[r * 4u + 1u]);
        let pb = max(part[r * 4u + 2u], part[r * 4u + 3u]);
        let pc = max(pa, pb);
        let new_m = max(m, max(max(pc.x, pc.y), max(pc.z, pc.w)));
        let corr = exp(m - new_m);
        let e0 = select(0.0, exp(s0 - new_m), v0);
        let e1 = select(0.0, exp(s1 - new_m), v1);
        let e2 = select(0.0, exp(s2 - new_m), v2);
        let e3 = select(0.0, exp(s3 - new_m), v3);
        let row = r * BK;
        sc[row + c] = e0;
        sc[row + c + 16u] = e1;
        sc[row + c + 32u] = e2;
        sc[row + c + 48u] = e3;
        l = l * corr + ((e0 + e1) + (e2 + e3));
        m = new_m;
        // @unroll u DV
        {
            // Values' dims [64u, 64u + 64), staged as the keys were; the next slice loaded
            // while this one is summed.
            // @unroll k 4
            ks[(r + {k}u * 16u) * RP + c] = kv{k};
            // @end k
            workgroupBarrier();
            let nd = ({u}u + 1u) * 16u + c;
            if ({u}u + 1u < DV) {
                let valid = nd < d4;
                // @unroll k 4
                kv{k} = select(vec4<f32>(0.0), vc[kr{k} + min(nd, d4 - 1u)], valid);
                // @end k
            }
            var a0 = acc{u} * corr;
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            for (var j = 0u; j < BK; j += 4u) {
                a0 += sc[row + j] * ks[j * RP + c];
                a1 += sc[row + j + 1u] * ks[(j + 1u) * RP + c];
                a2 += sc[row + j + 2u] * ks[(j + 2u) * RP + c];
                a3 += sc[row + j + 3u] * ks[(j + 3u) * RP + c];
            }
            acc{u} = (a0 + a1) + (a2 + a3);
            // Also orders this tile's reads of krow, sc and part before the next tile's writes.
            workgroupBarrier();
        }
        // @end u
    }
    // The row sum: the 16 threads' shares (all scaled to the same final maximum).
    part[r * 4u + c / 4u][c % 4u] = l;
    workgroupBarrier();
    let sa = part[r * 4u] + part[r * 4u + 1u];
    let sb = part[r * 4u + 2u] + part[r * 4u + 3u];
    let sv = sa + sb;
    let total = (sv.x + sv.y) + (sv.z + sv.w);
    if (t0 + r < n) {
        // @unroll u DV
        if (c + {u}u * 16u < d4) { o[qb + c + {u}u * 16u] = acc{u} / total; }
        // @end u
    }
}
