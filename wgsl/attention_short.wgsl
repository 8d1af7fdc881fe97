// attention_short: decode and verify attention in one dispatch for rows with few keys, where
// attention_split.wgsl + attention_combine.wgsl take two dependent dispatches whose cost is their
// latency, not their bytes (ledger: 2026-12-03 attention-short). One workgroup of WG threads per
// (head, token) walks every key of the row:
//   o[t, h] = Σ_p softmax_p(q[t, h] · K[p, kvh]) · V[p, kvh]   (scale 1.0, Gemma 4)
// over positions p in [lo, P] (P = pos0 + t; lo as attention_split.wgsl: first_key).
//
// Which rows: those with P + 1 − lo ≤ p.short_max keys; attention_split and attention_combine
// take the others (they return early for these), so a verify step that runs all three gives
// each row what a decode step at its position gives, whichever kernel that is (the host
// dispatches only the owning kernel in one-row steps: WgpuBackend::encode).
//
// Bindings: q: f32[n_tokens, n_heads * d] (or, in the q-norm form, the raw projection: bindings
//   6–8 and attention_qnorm.wgsl, as attention_split); kc, vc: the K/V caches as vec4s
//   ([slots + staging, n_kv_heads * d / 4], kv_row in common.wgsl); o: f32[n_tokens,
//   n_heads * d] as vec4s; p: AttnParams; step: Step.
// Launch: WG threads per (head, token); grid = (n_heads, n_tokens).
// Host guarantees: d % 8 == 0, d / 4 ≤ TV, WG a power of two ≥ 64 and ≥ d / 4.
//
// Per tile of WG keys (one tile for the rows this kernel is meant for):
// - scores: teams of TPK lanes, one key per team at a time, G keys per team in flight; a lane
//   holds VPL vec4s of q and of each key row (consecutive lanes, consecutive vec4s); the team's
//   partials are added by team_sum (a subgroup butterfly, or a workgroup-memory tree) and its
//   first lane stores the key's score in sc.
// - the tile's softmax with one key per thread: workgroup_max, e^(s − m), workgroup_sum, the
//   running (m, l) and the rescale of what earlier tiles accumulated (online softmax).
// - values: NTV groups of TV lanes, lane vl owning the row's vec4 vl; group g adds keys
//   g, g + NTV, … in order, GV rows in flight (the first batch issued before the softmax:
//   V does not depend on it); after the last tile the groups' sums are added in workgroup
//   memory (vh): groups 1.. store their sums and group 0 adds them in group order after one
//   barrier, then stores o = acc / l (one barrier where a halving tree of the groups took
//   2 log2(NTV): 0.1–0.5 µs faster per dispatch, ledger: 2026-12-03 attention-short-vars,
//   2026-12-05 attention-short-sum-group0).
// K and V registers are declared inside the loops that load them: declared at the kernel's top
// they live across the tile loop and cost ≈ 4 µs per dispatch at 1024 threads (ledger:
// 2026-12-03 attention-short-vars).

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: AttnParams;
@group(0) @binding(5) var<uniform> step: Step;

const WG: u32 = {{WG}}u;
const TPK: u32 = {{TPK}}u; // lanes per key (scores)
const VPL: u32 = {{VPL}}u; // vec4s of a row per lane (scores): ceil(d / 4 / TPK)
const G: u32 = {{G}}u;     // keys per team in flight (scores)
const NT: u32 = WG / TPK;
const TV: u32 = {{TV}}u;   // lanes per value row: a power of two ≥ d / 4
const NTV: u32 = WG / TV;
const GV: u32 = {{GV}}u;   // value rows per group in flight
const SG: u32 = {{SG}}u;   // subgroup size (1: none)
const DK: u32 = {{DK}}u;   // ceil(d / WG): attention_qnorm.wgsl's dims per thread
const VH: u32 = {{VH}}u;   // vh's vec4s: WG − TV, the value groups after the first
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>;
// The tile's scores, then its unnormalised weights.
var<workgroup> sc: array<f32, WG>;
// workgroup_sum / workgroup_max (reduce_*.wgsl), and team_sum's tree where there are no subgroups.
var<workgroup> red: array<f32, WG>;
var<workgroup> vh: array<vec4<f32>, VH>;

// {{WORKGROUP_SUM}}

// {{TEAM_SUM}}

fn load_query(t: u32, h: u32, lid: u32) -> u32 {
    let qb = t * p.n_heads * p.d + h * p.d;
    for (var i = lid; i < p.d; i += WG) { qs[i] = q[qb + i]; }
    workgroupBarrier();
    return first_key(step.pos0 + t, p.window);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) { return; }
    let pos = step.pos0 + t;
    // Rows with more keys belong to attention_split (a uniform branch: the whole workgroup).
    if (!short_row(pos)) { return; }
    let d = p.d;
    let d4 = d / 4u;
    let lo = {{LOAD_QUERY}}(t, h, lid);
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let kv4 = p.n_kv_heads * d4;
    let team = lid / TPK;
    let lane = lid % TPK;
    let vg = lid / TV;
    let vl = lid % TV;
    // @unroll v VPL
    var q{v} = vec4<f32>(0.0);
    if ({v}u * TPK + lane < d4) {
        let i = 4u * ({v}u * TPK + lane);
        q{v} = vec4<f32>(qs[i], qs[i + 1u], qs[i + 2u], qs[i + 3u]);
    }
    // @end v
    var m = NEG;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var base = lo; base <= pos; base += WG) {
        let n_valid = min(WG, pos + 1u - base);
        for (var r0 = 0u; r0 < n_valid; r0 += NT * G) {
            // @unroll g G
            let j{g} = r0 + {g}u * NT + team;
            let kb{g} = kv_row(base + min(j{g}, n_valid - 1u), p.slots) * kv4 + kvh * d4;
            // @unroll v VPL
            var k{g}_{v} = vec4<f32>(0.0);
            if ({v}u * TPK + lane < d4) { k{g}_{v} = kc[kb{g} + {v}u * TPK + lane]; }
            // @end v
            // @end g
            // @unroll g G
            {
                var s = 0.0;
                // @unroll v VPL
                s += dot(q{v}, k{g}_{v});
                // @end v
                let total = team_sum(s, lid);
                if (lane == 0u && j{g} < n_valid) { sc[j{g}] = total; }
            }
            // @end g
        }
        // The first batch of value rows, before the softmax needs the scores.
        // @unroll g GV
        let jv{g} = {g}u * NTV + vg;
        var v{g} = vec4<f32>(0.0);
        if (vl < d4) { v{g} = vc[kv_row(base + min(jv{g}, n_valid - 1u), p.slots) * kv4 + kvh * d4 + vl]; }
        // @end g
        workgroupBarrier();
        let s = select(NEG, sc[lid], lid < n_valid);
        let new_m = max(m, workgroup_max(s, lid));
        let e = select(0.0, exp(s - new_m), lid < n_valid);
        sc[lid] = e;
        // workgroup_sum's barriers also publish every thread's weight in sc.
        let tsum = workgroup_sum(e, lid);
        let corr = exp(m - new_m);
        l = l * corr + tsum;
        m = new_m;
        acc *= corr;
        for (var r0 = 0u; r0 < n_valid; r0 += NTV * GV) {
            // The next batch's rows are loaded before this one's are added.
            let r1 = r0 + NTV * GV;
            // @unroll g GV
            let nj{g} = r1 + {g}u * NTV + vg;
            var nv{g} = vec4<f32>(0.0);
            if (r1 < n_valid && vl < d4) { nv{g} = vc[kv_row(base + min(nj{g}, n_valid - 1u), p.slots) * kv4 + kvh * d4 + vl]; }
            // @end g
            // @unroll g GV
            if (r0 + {g}u * NTV + vg < n_valid) { acc += sc[r0 + {g}u * NTV + vg] * v{g}; }
            // @end g
            // @unroll g GV
            v{g} = nv{g};
            // @end g
        }
        // sc is rewritten by the next tile.
        workgroupBarrier();
    }
    // The groups' sums, added by group 0 in group order.
    if (vg > 0u) { vh[(vg - 1u) * TV + vl] = acc; }
    workgroupBarrier();
    if (vg == 0u) {
        for (var g = 1u; g < NTV; g++) { acc += vh[(g - 1u) * TV + vl]; }
    }
    if (vg == 0u && vl < d4) {
        o[(t * p.n_heads + h) * d4 + vl] = acc / l;
    }
}
