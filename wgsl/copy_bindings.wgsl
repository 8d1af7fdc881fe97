// copy_bindings: the params and bindings of the benchmark streams copy.wgsl and stream_read.wgsl
// (prepended by the host; CopyParams mirrors `CopyParams` in kernels.rs): n vec4 elements of
// src; stream_read's never-reached pattern in _pad0.

struct CopyParams {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: CopyParams;
@group(0) @binding(3) var<uniform> step: Step;
