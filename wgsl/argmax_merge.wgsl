// argmax_merge: the second argmax pass. For each output row t < step.n_out, best[t] = the index
// of the first maximum among the row's chunk maxima that softcap_argmax.wgsl wrote to part
// (chunks are in index order, so the first maximum among them is the row's first maximum:
// torch.argmax semantics).
//
// Bindings: logits (unused here: both passes bind the same buffers); part: u32[n_out, chunks, 2]
//   (value bits, index); best: u32[n_out]; p: ArgmaxParams; step: Step.
// Launch: 256 threads per row; grid = (n_out, 1). Deterministic: each thread scans its strided
// chunks in order keeping the first maximum, then a fixed tree picks (larger value, or equal
// value and lower index).


const WG: u32 = 256u;

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> best: array<u32>;
@group(0) @binding(3) var<uniform> p: ArgmaxParams;
@group(0) @binding(4) var<uniform> step: Step;


@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let t = wid.x;
    if (t >= step.n_out) { return; }
    var best_v = -3.0e38;
    var best_i = 0xffffffffu;
    for (var c = lid; c < p.chunks; c += WG) {
        let o = 2u * (t * p.chunks + c);
        let v = bitcast<f32>(part[o]);
        let i = part[o + 1u];
        // A chunk with no value above −3e38 reports index 0xffffffff: never picked over one
        // that has a value (strict >), and never over an equal real one (the index compare).
        if (v > best_v || (v == best_v && i < best_i)) { best_v = v; best_i = i; }
    }
    argmax_tree(best_v, best_i, lid);
    if (lid == 0u) { best[t] = bi[0]; }
}
