// persistent_chain: a probe for the persistent decode kernel (issue 5), not part of the forward
// pass. A chain of 4-bit mat-vecs, each stage's output the next one's input, as a decode step's
// layers are: run either as one dispatch per stage (wgpu puts a barrier between them, as between
// a step's dependent dispatches) or as one dispatch whose workgroups pass a grid barrier between
// stages, as a persistent kernel would. Weights do not depend on the activations, so in the
// persistent form a workgroup can issue its first weight loads of the next stage before it waits
// at the barrier (`prefetch`): their memory latency then hides behind the wait, where a new
// dispatch starts every workgroup cold. p.prefetch: 0, the loads after the barrier; 1, before it
// (before its release fence, which may wait for them); 2, inside it (after this workgroup's
// arrival, before the wait for the others). benches/kernels.rs times the forms.
//
// Bindings: w: the stages' weights as vec4<u32> (32 four-bit values: value 8 i + n at bits 4 n
//   of word i, MLX's order), each stage's rows from its `w` offset, cols / 32 vec4s per row;
//   sb: one word per row and group of 64 values: the bf16 scale in the low half, the bf16 bias
//   in the high half, each stage's from its `sb` offset; act: activations as f32 bits, a stage
//   reading cols values at `x` and writing rows values at `y`, handed over as atomics
//   (atomicStore, atomicLoad: what ledger: 2026-12-02 last-workgroup-handoff found seen across
//   a WGSL grid barrier, where plain
//   stores were stale); counter: atomic u32[1], barrier arrivals (it only grows, as in
//   grid_barrier.wgsl); p: ChainParams; step: Step (unused, bound for a uniform interface).
// Launch: WG threads; grid = (nwg, 1, 1). Stages p.first … p.first + p.count − 1 run in this
//   dispatch: count 1 is the dispatch form (nwg = rows / RB, or fewer striding over the row
//   blocks); count > 1 needs every workgroup resident at once (a workgroup waiting for one that
//   has not started spins forever: the caller sizes nwg for the device).
// Stage: y[r] = Σ_k (scale · q[r][k] + bias) · x[k] over groups of 64; rows a multiple of RB,
//   cols a multiple of 512 and ≤ XCAP. A workgroup owns blocks of RB rows, 16 lanes per row,
//   lane j reading the row's vec4s j, j + 16, …; each lane's sum, then the row's 16 in order.

struct ChainStage {
    rows: u32,
    cols: u32,
    w: u32,
    sb: u32,
    x: u32,
    y: u32,
    _pad0: u32,
    _pad1: u32,
}

struct ChainParams {
    first: u32,
    count: u32,
    prefetch: u32,
    _pad: u32,
    stages: array<ChainStage, {{MAX_STAGES}}>,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> sb: array<u32>;
@group(0) @binding(2) var<storage, read_write> act: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> counter: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> p: ChainParams;
@group(0) @binding(5) var<uniform> step: Step;

// Vec4s of weights a lane loads at once (and ahead of the barrier, with `prefetch`).
const PF: u32 = {{PF}}u;
// Threads per workgroup, and the rows of a block (16 lanes per row).
const WG: u32 = {{WG}}u;
const RB: u32 = WG / 16u;

// The stage's x, laid out so that the 16 lanes of a row read 16 consecutive vec4s: slot
// (v / 16) · 128 + (2 i + h) · 16 + v % 16 holds values 32 v + 8 i + h + {0, 2, 4, 6} (v: a
// vec4 of weights, i: its word, h: its even or odd nibbles).
var<workgroup> xs: array<vec4<f32>, {{XCAP4}}>;
var<workgroup> red: array<f32, WG>;
var<workgroup> base: u32;

// A lane's next PF vec4s of a row and their groups' scale-bias words.
struct Batch {
    q: array<vec4<u32>, PF>,
    s: array<u32, PF>,
}

// Vec4s c … c + PF − 1 of `lane` in `row` (those past the row's end are left zero).
fn load_batch(st: ChainStage, row: u32, lane: u32, c: u32) -> Batch {
    var b: Batch;
    let per = st.cols / 512u;
    for (var k = 0u; k < PF; k++) {
        if (c + k < per) {
            let v = (c + k) * 16u + lane;
            b.q[k] = w[st.w + row * (st.cols / 32u) + v];
            b.s[k] = sb[st.sb + row * (st.cols / 64u) + v / 2u];
        }
    }
    return b;
}

// Σ_k (s · q + b) · x over one vec4 of weights (columns 32 v …): s · Σ q x + b · Σ x.
fn dot_vec4(q: vec4<u32>, sbw: u32, v: u32) -> f32 {
    let at = (v / 16u) * 128u + v % 16u;
    var d = 0.0;
    var xsum = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let even = xs[at + 2u * i * 16u];
        let odd = xs[at + (2u * i + 1u) * 16u];
        d += dot(vec4<f32>(unpack4xU8(q[i] & 0x0f0f0f0fu)), even) + dot(vec4<f32>(unpack4xU8((q[i] >> 4u) & 0x0f0f0f0fu)), odd);
        xsum += dot(even + odd, vec4<f32>(1.0));
    }
    return bitcast<f32>(sbw << 16u) * d + bitcast<f32>(sbw & 0xffff0000u) * xsum;
}

// One grid-wide barrier (grid_barrier.wgsl's) in two halves, so that loads can be issued
// between them: `arrive` releases this workgroup's writes and counts it; `wait` returns once the
// counter reaches `all_arrived` and acquires everyone's.
fn arrive(lid: u32) {
    storageBarrier();
    if (lid == 0u) {
        atomicAdd(&counter[0], 1u);
    }
}

fn wait(all_arrived: u32, lid: u32) {
    if (lid == 0u) {
        loop {
            if (atomicLoad(&counter[0]) >= all_arrived) { break; }
        }
    }
    storageBarrier();
}

fn act_f32(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&act[i]));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid3: vec3<u32>,
        @builtin(num_workgroups) nwg3: vec3<u32>) {
    let lid = lid3.x;
    let wid = wid3.x;
    let nwg = nwg3.x;
    let lane = lid % 16u;
    // Barriers in this dispatch: count − 1, each nwg arrivals; the counter holds every earlier
    // dispatch's and at most the first barrier's of this one (grid_barrier.wgsl).
    if (lid == 0u && p.count > 1u) {
        let c = atomicLoad(&counter[0]);
        let per_dispatch = (p.count - 1u) * nwg;
        base = c - c % per_dispatch;
    }
    let b0 = workgroupUniformLoad(&base);
    for (var s = p.first; s < p.first + p.count; s++) {
        let st = p.stages[s];
        let blocks = st.rows / RB;
        // This workgroup's first batch of the stage (its first row block), loaded where
        // p.prefetch says; the first stage has no barrier before it.
        let at = select(p.prefetch, 1u, s == p.first);
        var first: Batch;
        if (at == 1u && wid < blocks) {
            first = load_batch(st, wid * RB + lid / 16u, lane, 0u);
        }
        if (s > p.first) {
            arrive(lid);
            if (at == 2u && wid < blocks) {
                first = load_batch(st, wid * RB + lid / 16u, lane, 0u);
            }
            wait(b0 + (s - p.first) * nwg, lid);
        }
        if (at == 0u && wid < blocks) {
            first = load_batch(st, wid * RB + lid / 16u, lane, 0u);
        }
        for (var t = lid; t < st.cols / 4u; t += WG) {
            let v = (t / 128u) * 16u + t % 16u;
            let ih = (t / 16u) % 8u;
            let k = st.x + 32u * v + 8u * (ih / 2u) + ih % 2u;
            xs[t] = vec4<f32>(act_f32(k), act_f32(k + 2u), act_f32(k + 4u), act_f32(k + 6u));
        }
        workgroupBarrier();
        let per = st.cols / 512u;
        for (var rb = wid; rb < blocks; rb += nwg) {
            let row = rb * RB + lid / 16u;
            var cur = first;
            if (rb != wid) {
                cur = load_batch(st, row, lane, 0u);
            }
            var acc = 0.0;
            for (var c = 0u; c < per; c += PF) {
                // The next batch's loads in flight while this one is multiplied.
                var next: Batch;
                if (c + PF < per) {
                    next = load_batch(st, row, lane, c + PF);
                }
                for (var k = 0u; k < PF; k++) {
                    if (c + k < per) {
                        acc += dot_vec4(cur.q[k], cur.s[k], (c + k) * 16u + lane);
                    }
                }
                cur = next;
            }
            red[lid] = acc;
            workgroupBarrier();
            if (lane == 0u) {
                var y = 0.0;
                for (var j = 0u; j < 16u; j++) {
                    y += red[lid + j];
                }
                atomicStore(&act[st.y + row], bitcast<u32>(y));
            }
            workgroupBarrier();
        }
    }
}
