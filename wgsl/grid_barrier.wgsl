// grid_barrier: `rounds` grid-wide barriers among the workgroups of one dispatch, built as a
// persistent kernel would build them between its phases in WGSL: a storageBarrier (meant to
// release this workgroup's writes), one atomic arrival per workgroup on a shared counter that
// thread 0 then spins on until every workgroup has arrived, and a second storageBarrier (meant
// to acquire everyone's). A benchmark kernel (benches/kernels.rs times one barrier), not part of
// the forward pass; it also counts the reads after a barrier that missed a neighbour's write
// from before it. On the H200 most did (ledger: 2026-11-30 grid-barrier-probe: 103902 of 132000
// at 132 workgroups): WGSL's
// barriers do not make plain storage writes of other workgroups visible, only atomics are.
// The atomic form (the host's choice: `slots` an array of atomics) hands the slots over as
// atomics (atomicStore before the barrier, atomicLoad after): on the H200 none was stale
// (ledger: 2026-12-02 last-workgroup-handoff: 0 of 132000–528000), at 1.5–2.7 µs per barrier,
// about a dependent dispatch.
//
// Requires every workgroup of the grid to be running at once: nothing guarantees that in
// general, and a workgroup waiting for one that has not started spins forever. The caller
// keeps the grid within what the device runs concurrently (the H200: 132 SMs, many small
// workgroups each; lavapipe: one workgroup per worker thread, so tests use one workgroup).
//
// Bindings: counter: atomic u32[1], arrivals of every dispatch so far (it only grows; each
//   dispatch finds its base, a multiple of rounds · nwg, from the value it first reads);
//   slots: u32[nwg] (atomic u32 in the atomic form); errors: atomic u32[1], the reads that saw
//   a neighbour's slot from before the last barrier; p: BarrierParams; step: Step (unused,
//   bound for a uniform interface).
// Launch: 64 threads per workgroup; grid = (nwg, 1, 1); rounds ≥ 2 and rounds · nwg · dispatches
//   < 2^32 (the counter does not wrap).
// Round r = 1 … rounds: thread 0 of workgroup i writes r to slots[i], all pass the barrier,
// then thread 0 reads slots[(i + 1) % nwg]: r or r + 1 (the neighbour may already be in the next
// round), never less.

// BarrierParams: barrier_params.wgsl (prepended by the host).

@group(0) @binding(0) var<storage, read_write> counter: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read_write> slots: {{SLOTS}};
@group(0) @binding(2) var<storage, read_write> errors: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> p: BarrierParams;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> base: u32;

fn put_slot(i: u32, v: u32) { {{PUT}} }
fn slot(i: u32) -> u32 { return {{GET}}; }

// One barrier: returns once the counter reaches `all_arrived` (every workgroup's arrival at
// this round). Every thread of the workgroup calls it.
fn grid_barrier(all_arrived: u32, lid: u32) {
    storageBarrier();
    if (lid == 0u) {
        atomicAdd(&counter[0], 1u);
        loop {
            if (atomicLoad(&counter[0]) >= all_arrived) { break; }
        }
    }
    storageBarrier();
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg3: vec3<u32>) {
    let lid = lid3.x;
    let nwg = nwg3.x;
    let per_dispatch = p.rounds * nwg;
    // At this dispatch's start the counter holds every earlier dispatch's arrivals plus at most
    // the first round's of this one (no workgroup passes round 1 before all have arrived).
    if (lid == 0u) {
        let c = atomicLoad(&counter[0]);
        base = c - c % per_dispatch;
    }
    let b = workgroupUniformLoad(&base);
    for (var r = 1u; r <= p.rounds; r++) {
        if (lid == 0u) { put_slot(wid.x, r); }
        grid_barrier(b + r * nwg, lid);
        if (lid == 0u && slot((wid.x + 1u) % nwg) < r) { atomicAdd(&errors[0], 1u); }
    }
}
