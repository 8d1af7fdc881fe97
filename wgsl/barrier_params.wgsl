// barrier_params: the params struct of grid_barrier.wgsl and last_workgroup.wgsl (prepended by
// the host; mirrors `BarrierParams` in kernels.rs): `rounds` is grid_barrier's barriers per
// dispatch and last_workgroup's values per workgroup.

struct BarrierParams {
    rounds: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
