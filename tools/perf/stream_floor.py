#!/usr/bin/env python3
"""The mat-vec floor of a decode step on the H200 (PERF_NOTES.md, ledger: 2026-12-02
kbench-clock-burst).

Each decode mat-vec reads its weights in one dispatch; kbench's stream table
(benches/results/2026-12-02-h200-stream-floor.txt: a bare read from memory in a dependent
chain, the best of 1/2/4/8 vec4s per thread, each timed right after a clock burst; rerun with
`bash tools/device/kbench.sh stream_read`) says what one dispatch can read at a size. An earlier
curve of the same day (ledger: 2026-12-02 stream-curve-low-clock) was timed at a lowered SM clock
and read 1.5-2.6x slow at 4-64 MB. This sums that time, interpolated linearly in bytes (below
1 MiB: the 1 MiB time; past 128 MiB: 128 MiB's bandwidth), over every mat-vec of one decode step
of the synthetic E2B, E4B and 26B-A4B models (`kestrel synth` presets, 4-bit with bf16 scales and
biases per 64 values: 0.5625 bytes per weight; the 26B's router 8-bit: 1.0625), and prints the
tok/s that floor allows with every other kernel of the step free.
Run: python3 tools/perf/stream_floor.py
"""

# (bytes read, µs): the held-clock stream table of 2026-12-02 (H200).
CURVE = [(1048576, 2.95), (4423680, 3.85), (8388608, 4.65), (14745600, 6.01),
         (16777216, 6.38), (29491200, 9.10), (67108864, 17.03), (134217728, 31.21)]
Q4, Q8 = 0.5625, 1.0625


def floor_us(nbytes):
    if nbytes <= CURVE[0][0]:
        return CURVE[0][1]
    for (b0, t0), (b1, t1) in zip(CURVE, CURVE[1:]):
        if nbytes <= b1:
            return t0 + (nbytes - b0) / (b1 - b0) * (t1 - t0)
    return CURVE[-1][1] * nbytes / CURVE[-1][0]


def dense(hidden, inter, layers, kv, period, shared, double, ple=256, vocab=262144, heads=8, hd=256, gd=512):
    """Every mat-vec of an E2B/E4B-shaped decode step, as (rows, cols, bytes per weight)."""
    mats = []
    for i in range(layers):
        d = gd if i % period == period - 1 else hd
        kv_shared = i >= layers - shared
        q = heads * d
        m = inter * (2 if double and kv_shared else 1)
        mats += [(q if kv_shared else q + 2 * kv * d, hidden, Q4), (hidden, q, Q4), (2 * m, hidden, Q4),
                 (hidden, m, Q4), (ple, hidden, Q4), (hidden, ple, Q4)]
    mats.append((layers * ple, hidden, Q4))  # the per-layer inputs' projection
    mats.append((vocab, hidden, Q4))  # the LM head
    return mats


def moe_26b():
    """Every mat-vec of a 26B-A4B decode step: attention, the dense branch, the router, the
    8 routed experts' GeGLU and down (one dispatch each over the 8 experts' rows)."""
    hidden, layers, vocab = 2816, 30, 262144
    mats = []
    for i in range(layers):
        full = i % 6 == 5
        q = 16 * (512 if full else 256)
        kvr = 2 * 512 if full else 2 * 8 * 256  # full layers: K only (V = K)
        mats += [(q + kvr, hidden, Q4), (hidden, q, Q4), (2 * 2112, hidden, Q4), (hidden, 2112, Q4),
                 (128, hidden, Q8), (8 * 2 * 704, hidden, Q4), (8 * hidden, 704, Q4)]
    mats.append((vocab, hidden, Q4))
    return mats


if __name__ == "__main__":
    for name, mats in [("E2B", dense(1536, 6144, 35, 1, 5, 20, True)),
                       ("E4B", dense(2560, 10240, 42, 2, 6, 18, False)),
                       ("26B-A4B", moe_26b())]:
        us = sum(floor_us(r * c * b) for r, c, b in mats)
        print(f"{name}: {len(mats)} mat-vecs, floor {us:.0f} µs per step -> {1e6 / us:.0f} tok/s with every other kernel free")
