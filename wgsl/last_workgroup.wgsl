// last_workgroup: the hand-off a fused decode kernel would make from a producer's workgroups to
// the one that arrives last (no spinning, no co-residency): every workgroup writes its share of
// an output, passes a storageBarrier (naga: a device-scope acquire-release fence on storage
// memory), and thread 0 counts its arrival on an atomic counter; the workgroup whose arrival is
// the grid's last passes a second storageBarrier and reads every workgroup's share — as the
// residual norm after o_proj or attention_combine after attention_split would, inside their
// producer. A benchmark and probe kernel (benches/kernels.rs: stale reads and cost per dispatch),
// not part of the forward pass. Plain stores of other workgroups were found stale across WGSL's
// grid barrier (a spinning reader; ledger: 2026-11-30 grid-barrier-probe); this asks the question
// for a reader that has not read the data before in its dispatch, with the data as plain values or
// (the host's choice) atomics.
//
// Bindings: counter: atomic u32[2], [0] arrivals in this dispatch (the last workgroup resets it
//   to 0), [1] the generation (dispatches so far; the last workgroup adds 1);
//   slots: u32[nwg · per] (atomic u32 in the atomic form), workgroup i's share at i · per;
//   errors: atomic u32[1], the values the last workgroup read that were not this generation's;
//   p: BarrierParams, `rounds` = per (values per workgroup, ≤ 256);
//   step: Step (unused, bound for a uniform interface).
// Launch: 256 threads per workgroup; grid = (nwg, 1, 1). Every workgroup of a dispatch reads the
// generation before the last one arrives, so all write the same generation's pattern.

// BarrierParams: barrier_params.wgsl (prepended by the host).

@group(0) @binding(0) var<storage, read_write> counter: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read_write> slots: {{SLOTS}};
@group(0) @binding(2) var<storage, read_write> errors: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> p: BarrierParams;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> generation: u32;
var<workgroup> arrived_last: u32;

fn put_share(i: u32, v: u32) { {{PUT}} }
fn share(i: u32) -> u32 { return {{GET}}; }

// The value slot i holds in generation g: differs between consecutive generations everywhere.
fn pattern(g: u32, i: u32) -> u32 { return g * 2654435761u + i; }

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg3: vec3<u32>) {
    let lid = lid3.x;
    let nwg = nwg3.x;
    let per = p.rounds;
    if (lid == 0u) { generation = atomicLoad(&counter[1]); }
    let g = workgroupUniformLoad(&generation);
    if (lid < per) { put_share(wid.x * per + lid, pattern(g, wid.x * per + lid)); }
    storageBarrier();
    if (lid == 0u) { arrived_last = select(0u, 1u, atomicAdd(&counter[0], 1u) == nwg - 1u); }
    if (workgroupUniformLoad(&arrived_last) == 0u) { return; }
    storageBarrier();
    var bad = 0u;
    for (var i = lid; i < nwg * per; i += 256u) {
        if (share(i) != pattern(g, i)) { bad += 1u; }
    }
    if (bad > 0u) { atomicAdd(&errors[0], bad); }
    if (lid == 0u) {
        atomicStore(&counter[0], 0u);
        atomicAdd(&counter[1], 1u);
    }
}
