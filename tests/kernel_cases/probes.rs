//! The benchmark probes' own tests: kernels no forward pass runs, which `benches/kernels.rs`
//! times to answer a design question (a grid-wide barrier, a last-workgroup hand-off, a
//! persistent chain of mat-vecs, the bare read of one dispatch). Each checks that what the
//! benchmark measures is what it claims to. They exist in the wgpu backend only, so these tests
//! run on its harness alone. (Tests only: the benchmarks that include this module see it empty,
//! hence the imports inside each test.)

/// grid_barrier (a benchmark kernel: the cost of one grid-wide barrier, for the persistent-kernel
/// question) counts its arrivals and sees its own writes across its barriers; each dispatch
/// finds its base in a counter earlier dispatches left. One workgroup only: lavapipe runs one
/// workgroup per worker thread, and a grid wider than what runs at once would spin forever.
#[test]
fn grid_barrier_counts_and_sees_its_writes() {
    use super::*;
    use kestrel::kernels::*;
    let Some(mut h) = crate::harness() else { return };
    let rounds = 40u32;
    let p = BarrierParams { rounds, _pad: [0; 3] };
    // A fresh counter, then one that two earlier dispatches of this grid left; the slots as
    // plain values and as atomics.
    for (start, atomic) in [0u32, 2 * rounds].into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let out = h
            .run(
                Kernel::GridBarrier { atomic },
                &[to_bytes(&[start]), to_bytes(&[0]), to_bytes(&[0])],
                bytemuck::bytes_of(&p),
                Step::default(),
                (1, 1, 1),
            )
            .unwrap();
        assert_eq!(
            words(&out[0]),
            vec![start + rounds],
            "counter after a dispatch from {start} (atomic slots: {atomic})"
        );
        assert_eq!(words(&out[1]), vec![rounds], "the workgroup's last round (atomic slots: {atomic})");
        assert_eq!(
            words(&out[2]),
            vec![0],
            "reads that saw a slot from before the last barrier (atomic slots: {atomic})"
        );
    }
}

/// last_workgroup (a probe kernel: a producer's workgroups hand their shares of an output to the
/// workgroup that arrives last) counts arrivals, elects one last workgroup per dispatch (the
/// generation advances by exactly one each), and that workgroup reads every share of its own
/// generation; the shares as plain values and as atomics, over 10 dispatches of one pass.
#[test]
fn last_workgroup_sees_every_share() {
    use super::*;
    use kestrel::kernels::*;
    let Some(mut h) = crate::harness() else { return };
    let pattern = |g: u32, i: u32| g.wrapping_mul(2654435761).wrapping_add(i);
    let (start, reps) = (7u32, 10u32);
    for atomic in [false, true] {
        for (nwg, per) in [(5u32, 4u32), (3, 256), (40, 2), (6, 0)] {
            let p = BarrierParams { rounds: per, _pad: [0; 3] };
            let data = vec![u32::MAX; (nwg * per).max(1) as usize];
            let bufs = [to_bytes(&[0, start]), to_bytes(&data), to_bytes(&[0])];
            let out = h
                .run_n(
                    Kernel::LastWorkgroup { atomic },
                    &bufs,
                    bytemuck::bytes_of(&p),
                    Step::default(),
                    (nwg, 1, 1),
                    reps,
                )
                .unwrap();
            let what = format!("{nwg} workgroups × {per} values (atomic: {atomic})");
            assert_eq!(
                words(&out[0]),
                vec![0, start + reps],
                "arrivals reset, generation advanced once per dispatch: {what}"
            );
            assert_eq!(words(&out[2]), vec![0], "shares the last workgroup read from another generation: {what}");
            if per > 0 {
                let want: Vec<u32> = (0..nwg * per).map(|i| pattern(start + reps - 1, i)).collect();
                assert_eq!(words(&out[1]), want, "the last dispatch's shares: {what}");
            }
        }
    }
}

/// persistent_chain (a probe kernel: a chain of 4-bit mat-vecs as one dispatch per stage or one
/// persistent dispatch with grid barriers) computes each stage of its chain against an f64
/// reference (tol::DOT: f32 sums of ≤ 1024 products per row, the error of the stage before
/// carried at its size), and every form writes the same bits: one dispatch per stage with one
/// workgroup per row block or two striding over them, and the persistent dispatch with the
/// next stage's first weights loaded before each barrier, inside it or after it. One workgroup
/// in the persistent form: lavapipe runs one workgroup per worker thread (grid_barrier's test says
/// why); the bench runs 132 on the H200.
#[test]
fn persistent_chain_forms_match_the_reference_and_each_other() {
    use super::*;
    use half::bf16;
    use kestrel::kernels::*;
    let Some(mut h) = crate::harness() else { return };
    let shapes = [(1024u32, 512u32), (512, 1024), (48, 512)];
    let layout = chain_layout(&shapes).unwrap();
    let mut rng = Rng::new(seed_of("persistent_chain"));
    let w: Vec<u32> = (0..4 * layout.w_vec4s).map(|_| rng.next_u64() as u32).collect();
    // Scales 2^-6 … 2^-5 and biases within −8 scales: values of either sign, as MLX's.
    let sb: Vec<u32> = (0..layout.sb_words)
        .map(|_| {
            let s = bf16::from_f32((1.0 + rng.uniform().abs()) / 64.0);
            let b = bf16::from_f32(-8.0 * s.to_f32() * rng.uniform().abs());
            u32::from(s.to_bits()) | u32::from(b.to_bits()) << 16
        })
        .collect();
    let x0 = rng.vec(shapes[0].1 as usize);
    let mut act = vec![POISON; layout.act_values];
    act[..x0.len()].copy_from_slice(&bits(&x0));
    // The f64 reference chain.
    let mut want: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
    let mut wants = Vec::new();
    for st in &layout.stages {
        let (rows, cols) = (st.rows as usize, st.cols as usize);
        let y: Vec<f64> = (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|k| {
                        let word = w[4 * st.w as usize + r * cols / 8 + k / 8];
                        let q = (word >> (4 * (k % 8))) & 15;
                        let g = sb[st.sb as usize + r * cols / 64 + k / 64];
                        let (s, b) = (bf16::from_bits(g as u16).to_f64(), bf16::from_bits((g >> 16) as u16).to_f64());
                        (s * q as f64 + b) * want[k]
                    })
                    .sum()
            })
            .collect();
        wants.push(y.clone());
        want = y;
    }
    let bufs = [to_bytes(&w), to_bytes(&sb), to_bytes(&act), to_bytes(&[0])];
    let params = |first: u32, count: u32, prefetch: ChainPrefetch| {
        bytemuck::bytes_of(&chain_params(&layout, first, count, prefetch)).to_vec()
    };
    let per_stage = |grid: Option<u32>| -> Vec<kestrel::backend::wgpu::harness::Link> {
        layout
            .stages
            .iter()
            .enumerate()
            .map(|(i, st)| (params(i as u32, 1, ChainPrefetch::After), (grid.unwrap_or(st.rows / 16), 1, 1)))
            .collect()
    };
    let n = layout.stages.len() as u32;
    let forms = [
        ("one dispatch per stage", per_stage(None)),
        ("one dispatch per stage, 2 workgroups", per_stage(Some(2))),
        ("persistent, loads before each barrier", vec![(params(0, n, ChainPrefetch::Before), (1, 1, 1))]),
        ("persistent, loads inside each barrier", vec![(params(0, n, ChainPrefetch::Inside), (1, 1, 1))]),
        ("persistent, loads after each barrier", vec![(params(0, n, ChainPrefetch::After), (1, 1, 1))]),
    ];
    let mut first_out: Option<Vec<u8>> = None;
    // Batches of 4 vec4s (lanes of 2 vec4s per row in the 1024-wide stage: a partial batch)
    // and of 1.
    for (pf, (what, links)) in [4u32, 1].into_iter().flat_map(|pf| forms.iter().map(move |f| (pf, f))) {
        let kernel = Kernel::PersistentChain { xcap: 1024, pf, wg: 256 };
        let what = format!("{what}, batches of {pf}");
        // Fresh buffers per form: the counter from 0, the outputs poisoned.
        let up = h.upload_chain(kernel, &bufs).unwrap();
        let out = h.run_chain(&up, links, Step::default()).unwrap();
        let got: Vec<f32> = words(&out[2]).into_iter().map(f32::from_bits).collect();
        assert_eq!(got[..x0.len()], x0[..], "{what}: the input changed");
        for (i, (st, y)) in layout.stages.iter().zip(&wants).enumerate() {
            let at = st.y as usize;
            if let Err(e) = compare(&got[at..at + y.len()], y, tol::DOT) {
                panic!("{what}: stage {i} ({} × {}): {e}", st.rows, st.cols);
            }
        }
        let barriers = if links.len() == 1 { n - 1 } else { 0 };
        assert_eq!(words(&out[3]), vec![barriers], "{what}: barrier arrivals");
        match &first_out {
            None => first_out = Some(out[2].clone()),
            Some(f) => assert!(f == &out[2], "{what}: not bitwise the first form's activations"),
        }
    }
}

/// stream_read (a benchmark kernel: the read bandwidth of one dispatch) stores nothing while
/// the OR of a thread's values misses `never`, and stores that OR where it reaches it — so the
/// benchmark's loads cannot be dropped and its zero data write nothing. 4 vec4s per thread
/// over 3000 (the last thread's indices clamped to the end).
#[test]
fn stream_read_stores_only_on_its_never_pattern() {
    use super::*;
    use kestrel::kernels::*;
    let Some(mut h) = crate::harness() else { return };
    let (n, vpt) = (3000u32, 4u32);
    let grid = (n.div_ceil(256 * vpt), 1, 1);
    let threads = 256 * grid.0;
    let dst = vec![0u8; 16 * threads as usize];
    let out = h
        .run(
            Kernel::StreamRead { vpt },
            &[vec![0u8; 16 * n as usize], dst.clone()],
            bytemuck::bytes_of(&CopyParams { n, _pad: [1, 0, 0] }),
            Step::default(),
            grid,
        )
        .unwrap();
    assert!(out[1].iter().all(|&b| b == 0), "zero data, never = 1: nothing stored");
    // Value i's bits in lane 0 of vec4 i: thread t's OR is that of i = t + k · threads, k < 4
    // (clamped to n − 1); `never` set to thread 5's OR: thread 5 (and any other reaching it)
    // stores its OR.
    let data: Vec<u32> = (0..n).flat_map(|i| [i, 0, 0, 0]).collect();
    let or_of = |t: u32| (0..vpt).fold(0u32, |a, k| a | (t + k * threads).min(n - 1));
    let never = or_of(5);
    let out = h
        .run(
            Kernel::StreamRead { vpt },
            &[to_bytes(&data), dst],
            bytemuck::bytes_of(&CopyParams { n, _pad: [never, 0, 0] }),
            Step::default(),
            grid,
        )
        .unwrap();
    let got = words(&out[1]);
    for t in 0..threads {
        let want = if or_of(t) == never { [or_of(t), 0, 0, 0] } else { [0; 4] };
        assert_eq!(got[4 * t as usize..4 * t as usize + 4], want, "thread {t}");
    }
}
