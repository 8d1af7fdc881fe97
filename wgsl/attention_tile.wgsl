// attention_tile: the query load, state and online-softmax step of attention_split.wgsl (decode),
// prepended after the kernel's bindings are known by name: the kernel declares `q`, `kc`, `vc`
// (the K/V cache bindings) and `p` (AttnParams with `slots`).
//
// load_query puts the query of (token t, head h) in `qs` and returns the first position it
// attends to; tile_softmax is the online-softmax step of one 64-key tile; thread lid owns the
// output dims i ≡ lid (mod 64) in `acc` (unnormalised). Host guarantees d ≤ 1024, d % 8 == 0.

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>;
var<workgroup> probs: array<f32, WG>;
var<private> acc: array<f32, 16>;

fn load_query(t: u32, h: u32, lid: u32) -> u32 {
    let qb = t * p.n_heads * p.d + h * p.d;
    for (var i = lid; i < p.d; i += WG) { qs[i] = q[qb + i]; }
    workgroupBarrier();
    return first_key(step.pos0 + t, p.window);
}

// The online-softmax step of one tile of keys (attention_split's attend_keys_lanes): thread lid
// holds the score s of key lid of the tile (NEG when lid ≥ n_valid; the valid keys are the first n_valid). Leaves the tile's unnormalised weights
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
