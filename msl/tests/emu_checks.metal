// emu_checks.metal — small kernels that exercise the MSL emulator's shim (simd ops, threadgroup
// memory, atomics, half) and a grid-barrier stress kernel; tests/msl_emu.rs compares them with
// Rust references. Compiled after grid_sync.metal in one translation unit.
#include <metal_stdlib>
using namespace metal;

// One float per thread in, eleven results per thread out (see tests/msl_emu.rs for the layout).
kernel void check_simd(device const float* in [[buffer(0)]],
                       device float* out [[buffer(1)]],
                       uint tid [[thread_position_in_grid]],
                       ushort lane [[thread_index_in_simdgroup]],
                       ushort sg [[simdgroup_index_in_threadgroup]],
                       uint nsg [[simdgroups_per_threadgroup]]) {
    float x = in[tid];
    device float* o = out + tid * 12;
    o[0] = simd_sum(x);
    o[1] = simd_max(x);
    o[2] = simd_min(x);
    o[3] = simd_shuffle(x, ushort(31 - lane));
    o[4] = simd_shuffle_xor(x, ushort(5));
    o[5] = simd_shuffle_down(x, ushort(3));
    o[6] = simd_broadcast(x, ushort(7));
    o[7] = float(simd_prefix_exclusive_sum(uint(lane + 1)));
    o[8] = simd_all(x > -100.0f) ? 1.0f : 0.0f;
    o[9] = simd_any(x > 0.9f) ? 1.0f : 0.0f;
    float4 v = float4(x, 2.0f * x, float2(1.0f, lane));
    float4 s = simd_sum(v);
    o[10] = s.y + s.w;
    o[11] = float(sg * 100 + nsg);
}

// Threadgroup memory, both forms: a body-scope array and a [[threadgroup(0)]] argument.
kernel void check_threadgroup(device const float* in [[buffer(0)]],
                              device float* out [[buffer(1)]],
                              threadgroup float* arg [[threadgroup(0)]],
                              uint lid [[thread_index_in_threadgroup]],
                              uint3 gid [[threadgroup_position_in_grid]],
                              uint3 tptg [[threads_per_threadgroup]]) {
    threadgroup float tile[64];
    uint base = gid.x * tptg.x;
    tile[lid] = in[base + lid];
    arg[lid] = 2.0f * in[base + lid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[2 * (base + lid)] = tile[63 - lid];
    out[2 * (base + lid) + 1] = arg[(lid + 1) % 64];
}

// Reads threadgroup memory nobody wrote: must see the 0xFF poison.
kernel void check_poison(device uint* out [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) {
    threadgroup uint never_written[4];
    out[lid] = never_written[lid % 4];
}

struct CheckParams {
    uint n;
    float scale;
};

kernel void check_atomics(device atomic_uint* counters [[buffer(0)]],
                          device int* out [[buffer(1)]],
                          constant CheckParams& p [[buffer(2)]],
                          uint tid [[thread_position_in_grid]],
                          uint lid [[thread_index_in_threadgroup]],
                          uint gid [[threadgroup_position_in_grid]]) {
    threadgroup atomic_uint local;
    if (lid == 0) atomic_store_explicit(&local, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(&counters[0], 1u, memory_order_relaxed);
    atomic_fetch_max_explicit(&counters[1], tid, memory_order_relaxed);
    atomic_fetch_min_explicit(&counters[2], tid + 7, memory_order_relaxed);
    atomic_fetch_or_explicit(&counters[3], 1u << (tid % 32), memory_order_relaxed);
    atomic_fetch_sub_explicit(&counters[4], 2u, memory_order_relaxed);
    uint expected = atomic_load_explicit(&counters[5], memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&counters[5], &expected, expected + 3u, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    atomic_exchange_explicit(&counters[6], 42u, memory_order_relaxed);
    atomic_fetch_add_explicit(&local, 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lid == 0) out[gid] = int(atomic_load_explicit(&local, memory_order_relaxed)) * int(p.n) + int(p.scale);
}

// float -> half -> float, and the half's bits.
kernel void check_half(device const float* in [[buffer(0)]],
                       device half* h [[buffer(1)]],
                       device float* back [[buffer(2)]],
                       device ushort* bits [[buffer(3)]],
                       uint tid [[thread_position_in_grid]]) {
    half x = half(in[tid]);
    h[tid] = x;
    back[tid] = h[tid];
    bits[tid] = as_type<ushort>(x);
}

// Every thread of the group at a barrier except half of the first simdgroup.
kernel void check_divergent_barrier(device float* out [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) {
    if (lid < 16) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[lid] = 1.0f;
}

kernel void check_divergent_simd(device float* out [[buffer(0)]], ushort lane [[thread_index_in_simdgroup]]) {
    float x = float(lane);
    if (lane < 16) {
        x = simd_sum(x);
    } else {
        x = simd_max(x);
    }
    out[lane] = x;
}

// Half a simdgroup waits at a simd op for lanes that wait at a threadgroup barrier.
kernel void check_deadlock(device float* out [[buffer(0)]], ushort lane [[thread_index_in_simdgroup]]) {
    float x = 1.0f;
    if (lane < 16) {
        x = simd_sum(x);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[lane] = x;
}

// Grid-barrier stress: each round every group writes its slice of `data`, a grid barrier, every
// thread sums column `lid` over all groups' slices, a second grid barrier (so nobody overwrites a
// slice another group is still reading).
struct StressParams {
    uint rounds;
    uint n_groups;
};

kernel void grid_stress(coherent(device) device uint* data [[buffer(0)]],
                        device uint* acc [[buffer(1)]],
                        coherent(device) device atomic_uint* counter [[buffer(2)]],
                        device atomic_uint* stall [[buffer(3)]],
                        constant StressParams& p [[buffer(4)]],
                        uint lid [[thread_index_in_threadgroup]],
                        uint gid [[threadgroup_position_in_grid]],
                        uint tpg [[threads_per_threadgroup]]) {
    uint phase = 0;
    uint sum = 0;
    for (uint r = 0; r < p.rounds; r++) {
        data[gid * tpg + lid] = (r + 1) * 1000003u + gid * 7919u + lid;
        grid_barrier(counter, p.n_groups, phase, lid, stall);
        for (uint g = 0; g < p.n_groups; g++) {
            sum += data[g * tpg + lid] * (g + 1);
        }
#ifndef STRESS_SKIP_SECOND_BARRIER
        grid_barrier(counter, p.n_groups, phase, lid, stall);
#endif
    }
    acc[gid * tpg + lid] = sum;
}
