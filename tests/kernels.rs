//! Per-kernel differential tests, after llama.cpp's test-backend-ops: every kernel runs alone
//! (one dispatch through a backend's [`KernelRunner`]) on random inputs and is compared with the
//! CPU reference (`kestrel::reference`, sums in f64). The cases are a table shared with the
//! benchmarks, one file per kernel family in `tests/kernel_cases/` (its `mod.rs` lists them);
//! this file runs it: every case × every runner of [`runners`] (wgpu today).
//!
//! Every case prints one line per backend that is a complete repro:
//!   `matmul_q4_t8(rows=65,cols=320,tokens=3,gs=64) seed=123456 [wgpu]: y NMSE 1.2e-14 <= 1e-9 OK`
//! Re-run it alone with `KESTREL_KERNELS='matmul_q4_t8(rows=65,cols=320,tokens=3,gs=64)' cargo
//! test --test kernels -- --nocapture` (the seed is derived from the name, so it comes back the
//! same).
//!
//! Env: `KESTREL_KERNELS=<substring>` runs only the cases whose name contains it;
//! `KESTREL_SEED=<n>` replaces every case's seed; `KESTREL_REQUIRE_GPU=1` turns
//! "skipped: no adapter" into a failure (CI sets it); `KESTREL_TUNING=<list>` compiles the
//! kernels with those settings (CI runs the tests again with `shader_checks=on`, naga's runtime
//! checks, so an out-of-range index shows as a difference between the runs; `subgroups=off`
//! takes every reduction through its workgroup-memory form: `KESTREL_TUNING=shader_checks=on,
//! subgroups=off cargo test --test kernels`).
//!
//! Rules every case follows:
//! - inputs are uniform in [-1, 1) from the case's seed (quantised weights go through
//!   `quant::quantize`, so kernel and reference see the same weights);
//! - outputs start POISONED (a NaN bit pattern) and are followed by a GUARD region; every word the
//!   kernel must not write (guard, padding, rows of other tokens/parts/slots) must read back
//!   unchanged, and any NaN in the compared region fails;
//! - comparison: non-finite values first (NaN fails, infinities must match in sign), then
//!   NMSE = Σ(a−b)²/Σb² against the case's threshold, each threshold argued in `tol`
//!   (kernel_cases/mod.rs);
//! - launch grids use the same formulas as `Builder::record` (src/backend/wgpu/mod.rs) and the
//!   kernel forms the same shape rules (`kestrel::kernels::shape`).
//!
//! Quick start — adding a case:
//! 1. A new shape of an existing kernel: add it to the loops of that family's `*_cases()` table
//!    (`tests/kernel_cases/<family>.rs`).
//! 2. A new kernel: in its family's file, write a `struct FooCase` with the parameters and
//!    `impl Case for FooCase`: `name()` prints EVERY parameter (name + seed = the repro),
//!    `kernel()` is the form the shape rules pick for them, `build(rng, want)` makes the buffers
//!    in binding order with `input*`/`output_*` (poison and guard come with them), computes the
//!    CPU reference inside `want.then(|| …)` (so the benchmarks can build the case at a real
//!    model's size without it), and sets params/step/grid as the real program would; then add a
//!    `foo_cases()` table to `all_cases()` (kernel_cases/mod.rs).
//! 3. Use a threshold from `tol` (kernel_cases/mod.rs) or add one there with its one-line
//!    argument.
//! 4. Keep the whole file under ~60 s on lavapipe in a debug build (inputs of a few MB at most).
//!
//! A new backend: implement `kestrel::kernels::KernelRunner` (its module doc says what a run
//! must do) and add it to [`runners`]: every case, and every test that compares forms of a
//! kernel, then runs on it too.

mod kernel_cases;

use std::collections::BTreeMap;

use kernel_cases::{all_cases, run_case, seed_of, Rng, Want};
use kestrel::backend::wgpu::harness::KernelHarness;
use kestrel::kernels::{Kernel, KernelRunner, Step, Tuning};

/// Every backend the kernel tests run on, each opened with [`tuning`] where it has a device
/// here: one line per backend.
fn runners() -> Vec<Box<dyn KernelRunner>> {
    let mut v: Vec<Box<dyn KernelRunner>> = Vec::new();
    v.extend(harness().map(|h| Box::new(h) as Box<dyn KernelRunner>));
    v
}

/// Runs `test` on every runner (none, printed as skipped, where no backend has a device and
/// none is required).
fn each_runner(mut test: impl FnMut(&mut dyn KernelRunner)) {
    for mut r in runners() {
        test(r.as_mut());
    }
}

fn gpu_required() -> bool {
    std::env::var("KESTREL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The tuning the kernels compile with: the defaults, or `KESTREL_TUNING`'s settings.
fn tuning() -> Tuning {
    let mut t = Tuning::default();
    if let Ok(list) = std::env::var("KESTREL_TUNING") {
        t.apply(&list).unwrap_or_else(|e| panic!("KESTREL_TUNING: {e}"));
    }
    t
}

/// The wgpu harness, or None (printed as skipped) where there is no adapter and none is
/// required. The probes' tests (kernel_cases/probes.rs) take it directly.
fn harness() -> Option<KernelHarness> {
    match KernelHarness::new(&tuning()) {
        Ok(h) => Some(h),
        Err(e) if e.to_string().contains("no GPU adapter") && !gpu_required() => {
            println!("skipped: no adapter ({e})");
            eprintln!("skipped: no adapter ({e})");
            None
        }
        Err(e) => panic!("kernel harness: {e}"),
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
    worst: f64,
}

#[test]
fn every_kernel_matches_the_cpu_reference() {
    let mut runners = runners();
    if runners.is_empty() {
        return;
    }
    for r in &runners {
        println!("device [{}]: {}", r.backend(), r.describe());
    }
    let changes = tuning().changes();
    if !changes.is_empty() {
        println!("tuning: {}", changes.join(", "));
    }
    let filter = std::env::var("KESTREL_KERNELS").unwrap_or_default();
    // Per (kernel label, backend).
    let mut tally: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    let start = std::time::Instant::now();
    for case in all_cases() {
        let name = case.name();
        if !name.contains(&filter) {
            continue;
        }
        let seed = seed_of(&name);
        let l = case.build(&mut Rng::new(seed), Want::Reference);
        for r in runners.iter_mut() {
            let backend = r.backend().to_string();
            let t = tally.entry((l.kernel.label(), backend.clone())).or_default();
            if !r.supports(l.kernel) {
                t.skipped += 1;
                println!("{name} seed={seed} [{backend}]: skipped: not in this backend");
                continue;
            }
            let line = match run_case(r.as_mut(), &l) {
                Ok((report, worst)) => {
                    t.passed += 1;
                    t.worst = t.worst.max(worst);
                    format!("{name} seed={seed} [{backend}]: {report} OK")
                }
                Err(e) => {
                    t.failed += 1;
                    let line = format!("{name} seed={seed} [{backend}]: FAIL {e}");
                    failures.push(line.clone());
                    line
                }
            };
            println!("{line}");
        }
    }
    println!(
        "\n{:<24} {:>6} {:>6} {:>7}  worst NMSE   ({:.1} s)",
        "kernel [backend]",
        "passed",
        "failed",
        "skipped",
        start.elapsed().as_secs_f64()
    );
    for ((k, b), t) in &tally {
        println!("{:<24} {:>6} {:>6} {:>7}  {:.1e}", format!("{k} [{b}]"), t.passed, t.failed, t.skipped, t.worst);
    }
    assert!(!tally.is_empty(), "KESTREL_KERNELS={filter:?} matches no case");
    assert!(failures.is_empty(), "{} kernel case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// The runner contract's error for a wrong number of buffers (`kernels::runner::check_buffers`).
#[test]
fn harness_rejects_a_wrong_number_of_buffers() {
    each_runner(|r| {
        let e = r.run(Kernel::GeluMul, &[vec![0; 4]], &[0; 16], Step::default(), (1, 1, 1)).unwrap_err();
        assert!(e.to_string().contains("gelu_mul takes 2 storage buffers, got 1"), "[{}] {e}", r.backend());
    });
}
