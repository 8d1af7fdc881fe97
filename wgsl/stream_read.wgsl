// stream_read: reads src[i] for i < p.n vec4 elements (VPT per thread) and writes nothing a
// caller reads — the read-only half of `copy`, for the bandwidth a mat-vec's weight stream can
// reach at a given size (benches/kernels.rs's stream table; not part of the forward pass). Each
// thread folds its values into one (bitwise OR of their bits, which no compiler can drop) and
// stores it only where that equals `never` (p._pad0), a pattern the host never lets the data
// reach: the loads stay, the stores do not happen.
//
// Bindings: src: vec4<f32>[n]; dst: vec4<f32>[threads] (written only on the impossible
//   pattern); p: CopyParams (n; _pad0: `never`); step: Step (unused, bound for a uniform
//   interface).
// Launch: 256 threads per workgroup; grid = ceil(n / (256 · VPT)): thread g reads elements
//   g + k · threads for k < VPT (threads = the grid's), all VPT loads issued before any is used
//   (indices past n clamped to n − 1).

const VPT: u32 = {{VPT}}u;

// CopyParams and the bindings: copy_bindings.wgsl (prepended by the host).

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let threads = nwg.x * 256u;
    var v: array<vec4<u32>, VPT>;
    // @unroll k VPT
    v[{k}] = bitcast<vec4<u32>>(src[min(gid.x + {k}u * threads, p.n - 1u)]);
    // @end k
    var acc = vec4<u32>(0u);
    for (var k = 0u; k < VPT; k++) {
        acc |= v[k];
    }
    let folded = acc.x | acc.y | acc.z | acc.w;
    if (folded == p._pad0) {
        dst[gid.x] = bitcast<vec4<f32>>(acc);
    }
}
