// attention_tile: the online-softmax loop of attention.wgsl (prefill) and the state and
// softmax step it shares with attention_split.wgsl (decode, whose key loop scores keys over the
// lanes instead). Prepended after the kernel's bindings are known by name:
// the kernel declares `kc`, `vc` (the K/V cache bindings) and `p` (AttnParams with `slots`).
//
// attend_keys(kvh, d, start, end, lid): over cached positions [start, end) of KV head kvh, with
// the query already in `qs`, keys in tiles of 64 (one per thread): m (running max) and l
// (running sum) are computed identically by every thread from the shared tile; thread lid owns
// the output dims i ≡ lid (mod 64) in `acc` (unnormalised). Returns (m, l). Must be called by
// every thread of the workgroup (it has barriers). Host guarantees d ≤ 1024 and d % 8 == 0.

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>;
var<workgroup> probs: array<f32, WG>;
var<private> acc: array<f32, 16>;

fn load_query(t: u32, h: u32, lid: u32) -> u32 {
    let qb = t * p.n_heads * p.d + h * p.d;
    for (var i = lid; i < p.d; i += WG) { qs[i] = q[qb + i]; }
    workgroupBarrier();
    let pos = step.pos0 + t;
    if (p.window > 0u && pos + 1u > p.window) { return pos + 1u - p.window; }
    return 0u;
}

fn attend_keys(kvh: u32, d: u32, start: u32, end: u32, lid: u32) -> vec2<f32> {
    let kv_stride = p.n_kv_heads * d;
    var m = NEG;
    var l = 0.0;
    for (var k = 0u; k < 16u; k++) { acc[k] = 0.0; }
    for (var base = start; base < end; base += WG) {
        let kp = base + lid;
        var s = NEG;
        if (kp < end) {
            let kb = kv_row(kp, p.slots) * kv_stride + kvh * d;
            s = 0.0;
            // In order, 8 loads issued per round (a plain loop waits on each): d % 8 == 0.
            for (var i0 = 0u; i0 < d; i0 += 8u) {
                for (var u = 0u; u < 8u; u++) { s += qs[i0 + u] * kc[kb + i0 + u]; }
            }
        }
        let n_valid = min(WG, end - base);
        let mlc = tile_softmax(s, lid, n_valid, m, l);
        l = mlc.y;
        let corr = mlc.z;
        // Constant trip count (unrolled, `acc` stays in registers); lanes past d idle.
        for (var k = 0u; k < 16u; k++) {
            let i = k * WG + lid;
            if (i < d) {
                var a = acc[k] * corr;
                for (var j = 0u; j < n_valid; j++) {
                    a += probs[j] * vc[kv_row(base + j, p.slots) * kv_stride + kvh * d + i];
                }
                acc[k] = a;
            }
        }
        m = mlc.x;
        workgroupBarrier();
    }
    return vec2<f32>(m, l);
}

// The online-softmax step of one tile of keys, shared by attend_keys and attention_split's
// attend_keys_lanes: thread lid holds the score s of key lid of the tile (NEG when
// lid ≥ n_valid; the valid keys are the first n_valid). Leaves the tile's unnormalised weights
// e^(s − m') in `probs` for the caller's V sums and returns (m', l', corr): the new running max,
// the new running sum and the factor e^(m − m') that rescales what was accumulated before.
// Every thread must call it (barriers).
fn tile_softmax(s: f32, lid: u32, n_valid: u32, m: f32, l: f32) -> vec3<f32> {
    probs[lid] = s;
    workgroupBarrier();
    var tmax = NEG;
    for (var j = 0u; j < n_valid; j++) { tmax = max(tmax, probs[j]); }
    let new_m = max(m, tmax);
    workgroupBarrier();
    probs[lid] = select(0.0, exp(s - new_m), lid < n_valid);
    workgroupBarrier();
    var tsum = 0.0;
    for (var j = 0u; j < n_valid; j++) { tsum += probs[j]; }
    let corr = exp(m - new_m);
    return vec3<f32>(new_m, l * corr + tsum, corr);
}
