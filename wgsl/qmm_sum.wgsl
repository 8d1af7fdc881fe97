// qmm_sum: the partial sums of a split-k qmm added in order:
//   y[t, y_off + r] = Σ_{s < k_splits} part[s · count + t, r]   (part rows are `rows` wide)
// for rows r < rows, tokens t < count (count = step.n_tokens, or step.n_out when count_sel = 1).
//
// Bindings: part: f32[k_splits · count, rows]; y: f32[count, y_stride]; p: MatmulParams (the
//   split qmm's own params: rows, y_stride, y_off, count_sel, k_splits); step: Step.
// Launch: 256 threads; grid = (ceil(rows / 256), count).
// Why: qmm splits the k loop of few-row matrices over more workgroups (qmm.wgsl); WGSL has no
// float atomics, and a fixed-order sum keeps every output one deterministic value.

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: MatmulParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let count = select(step.n_tokens, step.n_out, p.count_sel == 1u);
    let r = gid.x;
    let t = wid.y;
    if (r >= p.rows || t >= count) { return; }
    var acc = part[t * p.rows + r];
    for (var s = 1u; s < p.k_splits; s++) { acc += part[(s * count + t) * p.rows + r]; }
    y[t * p.y_stride + p.y_off + r] = acc;
}
