// embed: out[t, c] = scale · E[ids[t], c]   for tokens t < step.n_tokens whose id falls in this
// part of the table (rows [row0, row0 + rows)); other tokens are left to the other parts.
//
// Bindings: w, scales, biases: one row-range part of the table, format prepended (`load8`);
//   ids: u32[n_tokens]; out: f32[n_tokens, cols]; p: EmbedParams; step: Step.
// Launch: 64 threads, one 8-value chunk each; grid = (ceil(ceil(cols / 8) / 64), n_tokens),
//   x folded into x·z by the host past 65535 workgroups (as in matmul).
// Rows whose length is not a multiple of 8 (float tables only) go element by element. The scale is f32(√hidden) (or √ple_dim), computed on the host.

struct EmbedParams {
    rows: u32,
    cols: u32,
    gs: u32,
    row0: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}


@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> biases: array<u32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: EmbedParams;
@group(0) @binding(6) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = wid.y;
    let c8 = (wid.x + wid.z * nwg.x) * 64u + lid.x;
    if (t >= step.n_tokens || c8 * 8u >= p.cols) { return; }
    let id = ids[t];
    if (id < p.row0 || id >= p.row0 + p.rows) { return; }
    if (p.cols % 8u == 0u) {
        let v = load8(id - p.row0, c8, p.cols, p.gs);
        for (var j = 0u; j < 8u; j++) {
            out[t * p.cols + c8 * 8u + j] = v[j] * p.scale;
        }
    } else {
        for (var c = c8 * 8u; c < min(c8 * 8u + 8u, p.cols); c++) {
            out[t * p.cols + c] = load1(id - p.row0, c, p.cols, p.gs) * p.scale;
        }
    }
}
