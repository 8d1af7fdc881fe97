// attention_split: the decode form of attention.wgsl (same math, same per-tile online softmax),
// with the keys of each (token, head) split over `n_splits` workgroups so that a decode step
// fills the GPU instead of running one workgroup per head. Split s of the visible range
// [lo, P] covers keys [lo + s·c, lo + (s+1)·c) ∩ [lo, P], c = ceil((P + 1 − lo) / n_splits), and
// writes its running max m, running sum l and unnormalised output acc[d]; attention_combine.wgsl
// merges the splits. Empty splits write m = −3e38, l = 0. Rows of at most p.short_max keys are
// attention_short.wgsl's: their workgroups return at once.
//
// attention: o[t, h] = Σ_p softmax_p(q[t, h] · K[p, kvh]) · V[p, kvh]   (scale 1.0, Gemma 4)
//   for token t at position P = pos0 + t, query head h, kv head kvh = h / (n_heads / n_kv_heads),
//   over positions p in [lo, P]: lo = 0 (full layers) or max(0, P + 1 − window) (sliding layers).
// The cache is a ring: position p lives in row kv_row(p, slots) = p % slots, or a staging row in a
// verify step (common.wgsl) (slots ≥ window + chunk for sliding
// layers, so a chunk's own writes never evict a position one of its queries still needs).
//
// Bindings: q: f32[n_tokens, n_heads * d]; kc, vc: f32[slots, n_kv_heads * d];
//   part: f32[n_tokens, n_heads, n_splits, d + 2] (m, l, acc); p: AttnParams; step: Step.
// Launch: 64 threads per (head, split, token); grid = (n_heads, n_splits, n_tokens).
// The key loop is attend_keys_lanes below (load_query and the shared state come from
// attention_tile.wgsl, prepended by the host). The q-norm form ({{LOAD_QUERY}} =
// load_query_normed, attention_qnorm.wgsl appended) reads q before its norm and rope, and binds
// 6–8 more.



@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;

// Scores of one tile of keys, [key][lane]: lane partial dot products, then a tree per key.
var<workgroup> sred: array<f32, 4096>;

const DK: u32 = {{DK}}u; // dims per lane: ceil(d / 64)
const SG: u32 = {{SG}}u; // subgroup size (1: none; the scores then reduce by a tree)
const NSG: u32 = WG / SG;
const G: u32 = {{G}}u;   // keys whose loads are in flight together

// The key loop with the q·k dot products spread over the lanes: a split holds a few keys
// (≈ context / n_splits), so one thread per key (the first prefill kernel's loop) left most
// lanes idle and made each score a chain of d dependent loads (ledger: 2026-11-30
// attention-split-lanes). Here lane lid owns dims lid, lid + 64, … (DK of them: the query and the
// output accumulators stay in registers), the 64 partials per key are added by subgroupAdd and
// one pass over the NSG subgroup sums where the device has subgroups
// (attention_key_subgroup*.wgsl: one barrier), else by a fixed tree (attention_key_tree*.wgsl:
// six); the softmax step is tile_softmax (attention_tile.wgsl) and the V sums run in key order.
// Keys go G at a time with all G · DK loads issued before any is used: a GPU issues in order, so
// a load followed by its use waits a full memory round trip, and a rolled loop of them is a chain
// of round trips (ledger: 2026-11-30 latency-hygiene).
fn attend_keys_lanes(kvh: u32, d: u32, start: u32, end: u32, lid: u32) -> vec2<f32> {
    let kv_stride = p.n_kv_heads * d;
    var m = NEG;
    var l = 0.0;
    // @unroll k DK
    var q{k} = 0.0;
    if ({k}u * WG + lid < d) { q{k} = qs[{k}u * WG + lid]; }
    var acc{k} = 0.0;
    // @end k
    for (var base = start; base < end; base += WG) {
        let n_valid = min(WG, end - base);
        for (var j0 = 0u; j0 < n_valid; j0 += G) {
            // @unroll g G
            let kb{g} = kv_row(base + min(j0 + {g}u, n_valid - 1u), p.slots) * kv_stride + kvh * d;
            // @unroll k DK
            var k{g}_{k} = 0.0;
            if ({k}u * WG + lid < d) { k{g}_{k} = kc[kb{g} + {k}u * WG + lid]; }
            // @end k
            // @end g
            // @unroll g G
            if (j0 + {g}u < n_valid) {
                var s = 0.0;
                // @unroll k DK
                s += q{k} * k{g}_{k};
                // @end k
                // {{KEY_PARTIAL}}
            }
            // @end g
        }
        workgroupBarrier();
        // {{KEY_SUM}}
        let mlc = tile_softmax(s, lid, n_valid, m, l);
        l = mlc.y;
        let corr = mlc.z;
        // @unroll k DK
        acc{k} *= corr;
        // @end k
        for (var j0 = 0u; j0 < n_valid; j0 += G) {
            // @unroll g G
            let vb{g} = kv_row(base + min(j0 + {g}u, n_valid - 1u), p.slots) * kv_stride + kvh * d;
            // @unroll k DK
            var v{g}_{k} = 0.0;
            if ({k}u * WG + lid < d) { v{g}_{k} = vc[vb{g} + {k}u * WG + lid]; }
            // @end k
            // @end g
            // @unroll g G
            if (j0 + {g}u < n_valid) {
                let pj = probs[j0 + {g}u];
                // @unroll k DK
                acc{k} += pj * v{g}_{k};
                // @end k
            }
            // @end g
        }
        m = mlc.x;
        workgroupBarrier();
    }
    // The output dims go to `acc` (attention_tile.wgsl) for the caller's store.
    // @unroll k DK
    acc[{k}] = acc{k};
    // @end k
    return vec2<f32>(m, l);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let sp = wid.y;
    let t = wid.z;
    if (t >= step.n_tokens) { return; }
    let pos = step.pos0 + t;
    // attention_short's rows (a uniform branch: the whole workgroup).
    if (short_row(pos)) { return; }
    let d = p.d;
    let lo = {{LOAD_QUERY}}(t, h, lid);
    let chunk = (pos + 1u - lo + p.n_splits - 1u) / p.n_splits;
    let start = lo + sp * chunk;
    let end = min(start + chunk, pos + 1u); // exclusive; empty when start > pos
    let ml = attend_keys_lanes(h / (p.n_heads / p.n_kv_heads), d, start, max(start, end), lid);
    let pb = ((t * p.n_heads + h) * p.n_splits + sp) * (d + 2u);
    if (lid == 0u) {
        part[pb] = ml.x;
        part[pb + 1u] = ml.y;
    }
    // @unroll k DK
    if ({k}u * WG + lid < d) { part[pb + 2u + {k}u * WG + lid] = acc[{k}]; }
    // @end k
}
