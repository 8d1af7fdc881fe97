// softcap_argmax: for each output row t < step.n_out:
//   logits[t, i] = cap · tanh(logits[t, i] / cap)   (cap > 0; Gemma 4's final softcap, 30)
//   best[t] = the smallest i with the largest logits[t, i] (torch.argmax semantics).
// tanh is monotonic, so the argmax is taken after capping only to report capped logits.
//
// Bindings: logits: f32[n_out, vocab] (in/out); best: u32[n_out]; p: ArgmaxParams; step: Step.
// Launch: 256 threads per row; grid = (n_out, 1). Deterministic: each thread scans a strided
// slice in index order keeping the first maximum, then a fixed tree picks (value, lower index).

const WG: u32 = 256u;
const U: u32 = {{U}}u;

struct ArgmaxParams {
    vocab: u32,
    cap: f32,
    _pad0: u32,
    _pad1: u32,
}


@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> best: array<u32>;
@group(0) @binding(2) var<uniform> p: ArgmaxParams;
@group(0) @binding(3) var<uniform> step: Step;

var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;

fn tanh_stable(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * (1.0 - e) / (1.0 + e);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.x;
    if (t >= step.n_out) { return; }
    let base = t * p.vocab;
    var best_v = -3.0e38;
    var best_i = 0xffffffffu;
    // U loads per round are issued before any is used (one workgroup scans the whole row, so
    // the scan is a chain of load latencies); values are still visited in index order.
    for (var i0 = lid; i0 < p.vocab; i0 += WG * U) {
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
    }
    bv[lid] = best_v;
    bi[lid] = best_i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = bv[lid + s];
            let oi = bi[lid + s];
            if (ov > bv[lid] || (ov == bv[lid] && oi < bi[lid])) { bv[lid] = ov; bi[lid] = oi; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { best[t] = bi[0]; }
}
