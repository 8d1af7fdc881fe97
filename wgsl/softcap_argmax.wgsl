// softcap_argmax: the first of the two argmax passes. For each output row t < step.n_out and
// each chunk c of CH = 256 · U logits:
//   logits[t, i] = cap · tanh(logits[t, i] / cap)   (cap > 0; Gemma 4's final softcap, 30)
//   part[t, c] = (value, index) of the chunk's first maximum (index 0xffffffff when no value in
//                the chunk beats −3e38: all −∞ or NaN)
// argmax_merge.wgsl then picks each row's first maximum among its chunks. tanh is monotonic, so
// the argmax is taken after capping only to report capped logits.
//
// Why two passes: one workgroup scanning a 262144-entry row was a chain of load latencies,
// 146 µs per decode step on the H200 (4 % of an E2B step); a chunk per workgroup spreads the
// row over the GPU and leaves the merge a few hundred pairs.
//
// Bindings: logits: f32[n_out, vocab] (in/out); part: u32[n_out, chunks, 2] (value bits, index);
//   best: u32[n_out] (argmax_merge's output, unused here: both passes bind the same buffers);
//   p: ArgmaxParams; step: Step.
// Launch: 256 threads; grid = (chunks, n_out) with chunks = ceil(vocab / CH). Deterministic:
// each thread keeps the first maximum of its U values (visited in index order), then a fixed
// tree picks (larger value, or equal value and lower index).

const U: u32 = {{U}}u;
const CH: u32 = WG * U;

const WG: u32 = 256u;

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> best: array<u32>;
@group(0) @binding(3) var<uniform> p: ArgmaxParams;
@group(0) @binding(4) var<uniform> step: Step;


fn tanh_stable(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * (1.0 - e) / (1.0 + e);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.y;
    if (t >= step.n_out) { return; }
    let base = t * p.vocab;
    let i0 = wid.x * CH + lid;
    var best_v = -3.0e38;
    var best_i = 0xffffffffu;
    // All U loads are issued before any is used.
    // @unroll u U
    var v{u} = 0.0;
    if (i0 + {u}u * WG < p.vocab) { v{u} = logits[base + i0 + {u}u * WG]; }
    // @end u
    // @unroll u U
    if (i0 + {u}u * WG < p.vocab) {
        if (p.cap > 0.0) {
            v{u} = p.cap * tanh_stable(v{u} / p.cap);
            logits[base + i0 + {u}u * WG] = v{u};
        }
        if (v{u} > best_v) { best_v = v{u}; best_i = i0 + {u}u * WG; }
    }
    // @end u
    argmax_tree(best_v, best_i, lid);
    if (lid == 0u) {
        let o = 2u * (t * p.chunks + wid.x);
        part[o] = bitcast<u32>(bv[0]);
        part[o + 1u] = bi[0];
    }
}
