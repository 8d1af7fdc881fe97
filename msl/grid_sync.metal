// grid_sync.metal — the grid-wide barrier of the persistent Metal megakernel.
//
// Buffers:
//   counter  a zeroed device word, `coherent(device)`: the host clears it before every launch and
//            the kernel never resets it. Each barrier adds one arrival per threadgroup, so the n-th
//            barrier (phase n-1) completes when counter >= n * n_groups. A monotonic target needs
//            no reset, so there is no reset/generation hand-off to get wrong, and a group that is
//            already spinning on the next barrier cannot be confused with a late one.
//   stall    a device word the host reads after the launch: nonzero means a barrier gave up
//            waiting (value 1). The host reports it; the results of that launch are invalid.
// Launch rule: the grid must not exceed the threadgroups the GPU keeps co-resident (one per core
// is the safe choice). Metal gives no forward-progress guarantee between threadgroups and has no
// occupancy query, so a larger grid would spin forever; the bounded spin turns that into a report
// instead of a GPU hang or a watchdog kill.
#include <metal_stdlib>
using namespace metal;

#ifndef GRID_SYNC_SPIN_LIMIT
#define GRID_SYNC_SPIN_LIMIT (1u << 22)
#endif

// Every thread of every group calls this in uniform control flow; `phase` counts the barriers
// this thread has passed (starting at 0, identical in all threads); `lid` is the thread's index
// in its threadgroup.
inline void grid_barrier(coherent(device) device atomic_uint* counter, uint n_groups, thread uint& phase, uint lid,
                         coherent(device) device atomic_uint* stall) {
    // The whole group's writes (device and threadgroup) are done before its one arrival.
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    if (lid == 0) {
#ifndef GRID_SYNC_MUTATE_NO_RELEASE
        // Publishes this group's device writes before the arrival can be seen.
        atomic_thread_fence(mem_flags::mem_device, memory_order_release, thread_scope_device);
#endif
        atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
        uint target = (phase + 1) * n_groups;
        uint spins = 0;
        while (atomic_load_explicit(counter, memory_order_relaxed) < target) {
            if (++spins >= GRID_SYNC_SPIN_LIMIT) {
                atomic_store_explicit(stall, 1u, memory_order_relaxed);
                break;
            }
        }
#ifndef GRID_SYNC_MUTATE_NO_ACQUIRE
        // Makes the other groups' published writes visible to this group's later reads.
        atomic_thread_fence(mem_flags::mem_device, memory_order_acquire, thread_scope_device);
#endif
    }
    // The rest of the group waits for thread 0's wait (and its acquire).
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    phase += 1;
}
