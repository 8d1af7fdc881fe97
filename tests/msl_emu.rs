//! The MSL emulator: shim checks against Rust references, the grid-barrier stress kernel under
//! every scheduling mode (and its fence mutations, which must be caught), and the faults the
//! emulator must report instead of hanging or panicking. Needs clang++: these tests fail, not
//! skip, without it.

use std::path::Path;
use std::sync::OnceLock;

use kestrel::backend::metal::emu::{AlignedBytes, Binding, DispatchOptions, EmuBuild, EmuLibrary, Schedule};

const GRID_SYNC: &str = include_str!("../msl/grid_sync.metal");
const CHECKS: &str = include_str!("../msl/tests/emu_checks.metal");

fn build(defines: &[(&str, &str)]) -> EmuLibrary {
    let files = [("grid_sync.metal", GRID_SYNC), ("emu_checks.metal", CHECKS)];
    EmuLibrary::build(&EmuBuild { files: &files, defines, cxx: None }).unwrap_or_else(|e| panic!("{e}"))
}

fn lib() -> &'static EmuLibrary {
    static L: OnceLock<EmuLibrary> = OnceLock::new();
    L.get_or_init(|| build(&[]))
}

fn floats(v: &[f32]) -> AlignedBytes {
    AlignedBytes::from_slice(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}
fn uints(v: &[u32]) -> AlignedBytes {
    AlignedBytes::from_slice(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}
fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}
fn to_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// The emulator's reduction order: butterfly over xor 16, 8, 4, 2, 1.
fn butterfly(v: &[f32; 32], op: impl Fn(f32, f32) -> f32) -> [f32; 32] {
    let mut v = *v;
    for off in [16, 8, 4, 2, 1] {
        let mut n = [0f32; 32];
        for i in 0..32 {
            n[i] = op(v[i], v[i ^ off]);
        }
        v = n;
    }
    v
}

#[test]
fn simd_ops_match_reference() {
    let x = pseudo_random(64, 1);
    let mut input = floats(&x);
    let mut out = AlignedBytes::new(64 * 12 * 4);
    lib()
        .dispatch(
            "check_simd",
            [1, 1, 1],
            [64, 1, 1],
            &mut [Binding { index: 0, bytes: &mut input }, Binding { index: 1, bytes: &mut out }],
            &[],
            &DispatchOptions::default(),
        )
        .unwrap();
    let o = to_f32(&out);
    for sg in 0..2 {
        let lanes: [f32; 32] = x[sg * 32..sg * 32 + 32].try_into().unwrap();
        let sum = butterfly(&lanes, |a, b| a + b);
        let twice: [f32; 32] = std::array::from_fn(|i| 2.0 * lanes[i]);
        let lane_f: [f32; 32] = std::array::from_fn(|i| i as f32);
        let max = lanes.iter().cloned().fold(f32::MIN, f32::max);
        let min = lanes.iter().cloned().fold(f32::MAX, f32::min);
        for l in 0..32 {
            let r = &o[(sg * 32 + l) * 12..(sg * 32 + l) * 12 + 12];
            assert_eq!(r[0].to_bits(), sum[l].to_bits(), "simd_sum lane {l} (butterfly order, bit-exact)");
            assert_eq!(r[1], max);
            assert_eq!(r[2], min);
            assert_eq!(r[3], lanes[31 - l], "simd_shuffle");
            assert_eq!(r[4], lanes[l ^ 5], "simd_shuffle_xor");
            assert_eq!(r[5], if l + 3 < 32 { lanes[l + 3] } else { lanes[l] }, "simd_shuffle_down");
            assert_eq!(r[6], lanes[7], "simd_broadcast");
            assert_eq!(r[7], (l * (l + 1) / 2) as f32, "simd_prefix_exclusive_sum");
            assert_eq!(r[8], 1.0);
            assert_eq!(r[9], if lanes.iter().any(|&v| v > 0.9) { 1.0 } else { 0.0 });
            let vy = butterfly(&twice, |a, b| a + b)[l];
            let vw = butterfly(&lane_f, |a, b| a + b)[l];
            assert_eq!(r[10], vy + vw, "simd_sum of float4");
            assert_eq!(r[11], (sg * 100 + 2) as f32);
        }
    }
}

#[test]
fn threadgroup_memory_is_shared_and_poisoned() {
    let x = pseudo_random(128, 2);
    let mut input = floats(&x);
    let mut out = AlignedBytes::new(128 * 2 * 4);
    lib()
        .dispatch(
            "check_threadgroup",
            [2, 1, 1],
            [64, 1, 1],
            &mut [Binding { index: 0, bytes: &mut input }, Binding { index: 1, bytes: &mut out }],
            &[(0, 64 * 4)],
            &DispatchOptions { schedule: Schedule::Random, seed: 3, ..Default::default() },
        )
        .unwrap();
    let o = to_f32(&out);
    for g in 0..2 {
        for l in 0..64 {
            let i = g * 64 + l;
            assert_eq!(o[2 * i], x[g * 64 + 63 - l]);
            assert_eq!(o[2 * i + 1], 2.0 * x[g * 64 + (l + 1) % 64]);
        }
    }
    let mut out = AlignedBytes::new(32 * 4);
    lib()
        .dispatch(
            "check_poison",
            [1, 1, 1],
            [32, 1, 1],
            &mut [Binding { index: 0, bytes: &mut out }],
            &[],
            &Default::default(),
        )
        .unwrap();
    assert!(to_u32(&out).iter().all(|&v| v == u32::MAX));
}

#[test]
fn atomics_match_reference() {
    let mut counters = uints(&[0, 0, u32::MAX, 0, 1000, 0, 0, 0]);
    let mut out = AlignedBytes::new(4 * 4);
    let mut params = AlignedBytes::from_slice(&[3u32.to_le_bytes(), 5f32.to_le_bytes()].concat());
    lib()
        .dispatch(
            "check_atomics",
            [4, 1, 1],
            [64, 1, 1],
            &mut [
                Binding { index: 0, bytes: &mut counters },
                Binding { index: 1, bytes: &mut out },
                Binding { index: 2, bytes: &mut params },
            ],
            &[],
            &DispatchOptions { schedule: Schedule::Random, seed: 9, ..Default::default() },
        )
        .unwrap();
    let c = to_u32(&counters);
    assert_eq!(&c[..7], &[256, 255, 7, u32::MAX, 1000u32.wrapping_sub(512), 768, 42]);
    assert_eq!(to_u32(&out), vec![64 * 3 + 5; 4]);
}

#[test]
fn half_round_trips_to_nearest_even() {
    let mut x: Vec<f32> =
        pseudo_random(4000, 4).iter().enumerate().map(|(i, v)| v * (2f32).powi(i as i32 % 40 - 24)).collect();
    x.extend([
        0.0,
        -0.0,
        65504.0,
        65520.0,
        1e9,
        -1e9,
        5.96e-8,
        2.98e-8,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        f32::INFINITY,
        f32::NAN,
    ]);
    x.resize(4096, 0.5);
    let n = x.len();
    let mut input = floats(&x);
    let mut h = AlignedBytes::new(n * 2);
    let mut back = AlignedBytes::new(n * 4);
    let mut bits = AlignedBytes::new(n * 2);
    lib()
        .dispatch(
            "check_half",
            [(n / 64) as u32, 1, 1],
            [64, 1, 1],
            &mut [
                Binding { index: 0, bytes: &mut input },
                Binding { index: 1, bytes: &mut h },
                Binding { index: 2, bytes: &mut back },
                Binding { index: 3, bytes: &mut bits },
            ],
            &[],
            &Default::default(),
        )
        .unwrap();
    let back = to_f32(&back);
    for i in 0..n {
        let want = half::f16::from_f32(x[i]);
        let got = u16::from_le_bytes([bits[2 * i], bits[2 * i + 1]]);
        let stored = u16::from_le_bytes([h[2 * i], h[2 * i + 1]]);
        if x[i].is_nan() {
            assert!(half::f16::from_bits(got).is_nan() && back[i].is_nan());
            continue;
        }
        assert_eq!(got, want.to_bits(), "half({}) bits", x[i]);
        assert_eq!(stored, want.to_bits());
        assert_eq!(back[i].to_bits(), want.to_f32().to_bits(), "half({}) -> float", x[i]);
    }
}

const GROUPS: u32 = 8;
const THREADS: u32 = 64;
const ROUNDS: u32 = 10;

fn stress_expected() -> Vec<u32> {
    let mut v = Vec::new();
    for _g in 0..GROUPS {
        for lid in 0..THREADS {
            let mut s = 0u32;
            for r in 0..ROUNDS {
                for g2 in 0..GROUPS {
                    let d = (r + 1).wrapping_mul(1000003).wrapping_add(g2 * 7919).wrapping_add(lid);
                    s = s.wrapping_add(d.wrapping_mul(g2 + 1));
                }
            }
            v.push(s);
        }
    }
    v
}

/// Runs the stress kernel; Ok(true) when the result is right and no barrier stalled.
fn run_stress(lib: &EmuLibrary, opts: &DispatchOptions) -> kestrel::error::Result<bool> {
    let n = (GROUPS * THREADS) as usize;
    let mut data = AlignedBytes::new(n * 4);
    let mut acc = AlignedBytes::new(n * 4);
    let mut counter = AlignedBytes::new(64);
    let mut stall = AlignedBytes::new(64);
    let mut params = uints(&[ROUNDS, GROUPS]);
    lib.dispatch(
        "grid_stress",
        [GROUPS, 1, 1],
        [THREADS, 1, 1],
        &mut [
            Binding { index: 0, bytes: &mut data },
            Binding { index: 1, bytes: &mut acc },
            Binding { index: 2, bytes: &mut counter },
            Binding { index: 3, bytes: &mut stall },
            Binding { index: 4, bytes: &mut params },
        ],
        &[],
        opts,
    )?;
    Ok(to_u32(&stall)[0] == 0 && to_u32(&acc) == stress_expected())
}

#[test]
fn grid_barrier_stress_passes_every_mode() {
    let l = lib();
    assert!(run_stress(l, &DispatchOptions::default()).unwrap(), "FIFO");
    assert!(run_stress(l, &DispatchOptions { incoherent: true, ..Default::default() }).unwrap(), "incoherent FIFO");
    for seed in 0..50 {
        let o = DispatchOptions { schedule: Schedule::Random, seed, ..Default::default() };
        assert!(run_stress(l, &o).unwrap(), "random seed {seed}");
    }
    for seed in 0..10 {
        let o = DispatchOptions { schedule: Schedule::Random, seed, incoherent: true, ..Default::default() };
        assert!(run_stress(l, &o).unwrap(), "incoherent random seed {seed}");
    }
}

#[test]
fn grid_barrier_missing_release_fence_is_caught() {
    let l = build(&[("GRID_SYNC_MUTATE_NO_RELEASE", "1")]);
    assert!(!run_stress(&l, &DispatchOptions { incoherent: true, ..Default::default() }).unwrap());
    let o = DispatchOptions { schedule: Schedule::Random, seed: 1, incoherent: true, ..Default::default() };
    assert!(!run_stress(&l, &o).unwrap());
}

#[test]
fn grid_barrier_missing_acquire_fence_is_caught() {
    let l = build(&[("GRID_SYNC_MUTATE_NO_ACQUIRE", "1")]);
    assert!(!run_stress(&l, &DispatchOptions { incoherent: true, ..Default::default() }).unwrap());
    let o = DispatchOptions { schedule: Schedule::Random, seed: 1, incoherent: true, ..Default::default() };
    assert!(!run_stress(&l, &o).unwrap());
}

#[test]
fn racing_read_without_second_barrier_is_caught_by_random_schedule() {
    let l = build(&[("STRESS_SKIP_SECOND_BARRIER", "1")]);
    let caught = (0..20)
        .filter(|&seed| {
            !run_stress(&l, &DispatchOptions { schedule: Schedule::Random, seed, ..Default::default() }).unwrap()
        })
        .count();
    assert!(caught > 0, "no random seed exposed the race");
}

#[test]
fn grid_larger_than_resident_groups_is_reported() {
    let e = run_stress(lib(), &DispatchOptions { max_resident_groups: Some(4), ..Default::default() }).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("livelock") && m.contains("not resident") && m.contains("grid_sync.metal:"), "{m}");
}

fn fault(kernel: &str, threads: u32) -> String {
    let mut out = AlignedBytes::new(4096);
    lib()
        .dispatch(
            kernel,
            [1, 1, 1],
            [threads, 1, 1],
            &mut [Binding { index: 0, bytes: &mut out }],
            &[],
            &Default::default(),
        )
        .unwrap_err()
        .to_string()
}

#[test]
fn faults_are_errors_naming_the_metal_line() {
    let m = fault("check_divergent_barrier", 64);
    assert!(m.contains("check_divergent_barrier") && m.contains("emu_checks.metal:"), "{m}");
    assert!(m.contains("threadgroup_barrier"), "{m}");
    let m = fault("check_divergent_simd", 32);
    assert!(m.contains("divergent") && m.contains("emu_checks.metal:"), "{m}");
    let m = fault("check_deadlock", 32);
    assert!(m.contains("deadlock") && m.contains("emu_checks.metal:"), "{m}");
    let m = fault("no_such_kernel", 32);
    assert!(m.contains("no kernel `no_such_kernel`") && m.contains("check_simd"), "{m}");
    // Unaligned buffer.
    let mut v = AlignedBytes::new(64);
    let e = lib()
        .dispatch(
            "check_poison",
            [1, 1, 1],
            [4, 1, 1],
            &mut [Binding { index: 0, bytes: &mut v[4..] }],
            &[],
            &Default::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("aligned"), "{e}");
}

#[test]
fn address_space_mismatch_fails_to_build() {
    let src = "#include <metal_stdlib>\nusing namespace metal;\n\nvoid scale(thread float* p) { p[0] *= 2.0f; }\n\nkernel void k(device float* x [[buffer(0)]]) {\n    scale(x);\n}\n";
    let e = EmuLibrary::build(&EmuBuild { files: &[("bad.metal", src)], defines: &[], cxx: None })
        .err()
        .expect("must not build");
    let m = e.to_string();
    assert!(m.contains("bad.metal:7:"), "{m}");
    assert!(m.contains("address space"), "{m}");
}

#[test]
fn missing_compiler_is_a_clear_error() {
    let e = EmuLibrary::build(&EmuBuild {
        files: &[("a.metal", CHECKS)],
        defines: &[],
        cxx: Some(Path::new("/nonexistent/clang++")),
    })
    .err()
    .expect("must fail");
    assert!(e.to_string().contains("install clang"), "{e}");
}

/// Several threads dispatching on one library at once (cargo runs tests in parallel, and the
/// runtime keeps its state per dispatch): every random-schedule stress run still sums right.
#[test]
fn concurrent_dispatches_share_a_library() {
    let small = lib();
    std::thread::scope(|s| {
        for seed in 0..4u64 {
            let small = &small;
            s.spawn(move || {
                for k in 0..5 {
                    let o = DispatchOptions { schedule: Schedule::Random, seed: seed * 10 + k, ..Default::default() };
                    assert!(run_stress(small, &o).unwrap());
                }
            });
        }
    });
}
