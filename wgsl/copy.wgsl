// copy: dst[i] = src[i] for i < p.n vec4 elements — the bandwidth roofline `kestrel bench` and
// `benches/kernels.rs` measure kernels against (what a streaming kernel can move on this device
// through the same API, rather than a vendor figure).
//
// Bindings: src: vec4<f32>[n]; dst: vec4<f32>[n]; p: CopyParams; step: Step (unused, bound for
//   a uniform interface).
// Launch: 256 threads per workgroup, any grid: a grid-stride loop covers n.

// CopyParams and the bindings: copy_bindings.wgsl (prepended by the host).

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let total = nwg.x * 256u;
    for (var i = gid.x; i < p.n; i += total) {
        dst[i] = src[i];
    }
}
