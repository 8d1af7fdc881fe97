//! MoE experts resident and streamed, against transformers: every tiny MoE fixture (16 experts
//! top-4, 32 experts top-8 with a window of 5, 8 experts top-2), HF and MLX-4-bit, installed with
//! `kestrel install` and run in every slot mode:
//!
//! - `checkpoint`: the stacked expert tensors of the source checkpoint, all resident;
//! - `installed-all`: the installation with every expert loaded into slots at start;
//! - `slots=E`: streamed, one slot per expert (fills on first use, never evicts);
//! - `slots=2K-1`: streamed with fewer slots than two tokens' experts (heavy eviction; prefill
//!   chunks of 16 tokens need several rounds per layer);
//! - `slots=K-1` (K > 2): fewer slots than one token's experts: every decode step runs in rounds.
//!
//! Ids must equal transformers exactly and every step's logits stay within the form's tolerance
//! of it (`common::logit_tol` argues it). Across modes the arithmetic is the same — only where
//! the expert rows sit changes — so each backend's logits must be *bitwise* equal in every mode.

mod common;

use std::path::PathBuf;

use common::*;
use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::metal::{MetalBackend, MetalOptions};
use kestrel::backend::wgpu::WgpuOptions;
use kestrel::backend::{Backend, Readback};
use kestrel::install::{self, InstallOptions};
use kestrel::kernels::Tuning;
use kestrel::model::Model;
use kestrel::streamer::{ExpertSlots, StreamStats};

const CHUNK: usize = 16;
const MODELS: [&str; 3] = ["tiny-moe", "tiny-moe-k8", "tiny-moe-e8"];

/// Teacher-forced run of one prompt: the greedy id and the logits of every generation step.
fn run_prompt(b: &mut dyn Backend, r: &PromptRef) -> (Vec<u32>, Vec<Vec<f32>>) {
    b.reset();
    let vocab = b.config().text.vocab_size;
    let mut pos = 0;
    let mut last = None;
    for piece in r.prompt.chunks(CHUNK) {
        last = Some(b.prefill(piece, pos, Readback::LastLogits).unwrap());
        pos += piece.len();
    }
    let last = last.unwrap();
    let mut ids = vec![last.argmax[0]];
    let mut logits = vec![last.logits[last.logits.len() - vocab..].to_vec()];
    for step in 0..r.generated.len() - 1 {
        let out = b.decode(r.generated[step], pos, Readback::LastLogits).unwrap();
        pos += 1;
        ids.push(out.argmax[0]);
        logits.push(out.logits);
    }
    (ids, logits)
}

fn install_fixture(name: &str, form: &str, tag: &str) -> (tempdir::Dir, PathBuf) {
    let tmp = tempdir::Dir::new(&format!("experts-{tag}-{name}-{form}"));
    let dst = tmp.path().join("installed");
    install::install(&fixtures().join(name).join(form), &dst, &InstallOptions::default()).unwrap();
    (tmp, dst)
}

/// Minimal self-cleaning temp directory (no extra crate for one use).
mod tempdir {
    use std::path::{Path, PathBuf};
    pub struct Dir(PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("kestrel-test-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

struct Mode {
    label: String,
    installed: bool,
    slots: ExpertSlots,
}

fn modes(e: usize, k: usize) -> Vec<Mode> {
    let mut m = vec![
        Mode { label: "checkpoint".into(), installed: false, slots: ExpertSlots::All },
        Mode { label: "installed-all".into(), installed: true, slots: ExpertSlots::All },
        Mode { label: format!("slots={e}"), installed: true, slots: ExpertSlots::Some(e) },
        Mode { label: format!("slots={}", 2 * k - 1), installed: true, slots: ExpertSlots::Some(2 * k - 1) },
    ];
    if k > 2 {
        m.push(Mode { label: format!("slots={}", k - 1), installed: true, slots: ExpertSlots::Some(k - 1) });
    }
    m
}

/// Builds a backend of one kind for a model with the given expert slots (None: no adapter).
type MakeBackend = dyn Fn(&Model, ExpertSlots) -> Option<Box<dyn Backend>>;

/// Checks one backend kind over every mode of one fixture form, on the reference prompts `which`.
fn check_form(name: &str, form: &str, reference: &str, backend: &str, which: &[usize], make: &MakeBackend) {
    check_form_from(name, form, reference, backend, which, 0, make)
}

/// `check_form` over the modes with at least `min_slots` slots (a backend that needs a token's
/// top-k resident at once; its refusal of fewer is checked on its own).
fn check_form_from(
    name: &str,
    form: &str,
    reference: &str,
    backend: &str,
    which: &[usize],
    min_slots: usize,
    make: &MakeBackend,
) {
    let refs: Vec<(usize, PromptRef)> =
        load_refs(name, reference).into_iter().enumerate().filter(|(i, _)| which.contains(i)).collect();
    let (_tmp, dir) = install_fixture(name, form, backend);
    let source = open_model(name, form);
    let installed = Model::open(&dir).unwrap();
    let (e, k) = (source.cfg.text.num_experts, source.cfg.text.top_k_experts);
    let mut baseline: Option<Vec<Vec<Vec<f32>>>> = None;
    for mode in modes(e, k) {
        if matches!(mode.slots, ExpertSlots::Some(n) if n < min_slots) {
            continue;
        }
        let model = if mode.installed { &installed } else { &source };
        let Some(mut b) = make(model, mode.slots) else { return };
        let label = format!("{backend} {name}/{form} {}", mode.label);
        let mut all = Vec::new();
        let mut worst = 0.0f32;
        let tol = logit_tol(form);
        for (i, r) in refs.iter().map(|(i, r)| (*i, r)) {
            let (ids, logits) = run_prompt(b.as_mut(), r);
            assert_eq!(ids, r.generated, "{label} prompt {i}: ids differ from transformers");
            for (step, want) in r.step_logits.iter().enumerate() {
                let d = max_abs_diff(&logits[step], want);
                assert!(d <= tol, "{label} prompt {i} step {step}: logits differ by {d} > {tol}");
                worst = worst.max(d);
            }
            all.push(logits);
        }
        let stats = b.stream_stats();
        check_stats(&label, &mode, stats, e, k);
        match &baseline {
            None => baseline = Some(all),
            Some(base) => {
                for (p, (a, bb)) in base.iter().zip(&all).enumerate() {
                    for (s, (x, y)) in a.iter().zip(bb).enumerate() {
                        assert!(
                            x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits()),
                            "{label} prompt {p} step {s}: logits not bitwise equal to the checkpoint run"
                        );
                    }
                }
            }
        }
        eprintln!(
            "{label}: ids equal transformers, max |Δlogit| {worst:.2e}, logits bitwise equal across modes; {}",
            describe(stats)
        );
    }
}

fn describe(s: Option<StreamStats>) -> String {
    match s {
        None => "resident".into(),
        Some(s) => format!(
            "hit rate {:.3}, {} misses, {} evictions, {:.0} B/token",
            s.hit_rate(),
            s.misses,
            s.evictions,
            s.bytes_per_token()
        ),
    }
}

fn check_stats(label: &str, mode: &Mode, stats: Option<StreamStats>, e: usize, k: usize) {
    match mode.slots {
        ExpertSlots::All => assert!(stats.is_none(), "{label}: resident mode reports streaming"),
        ExpertSlots::Some(n) => {
            let s = stats.unwrap_or_else(|| panic!("{label}: streamed mode without stats"));
            assert!(s.misses > 0 && s.bytes_read > 0 && s.tokens > 0, "{label}: nothing was read: {s:?}");
            if n >= e {
                // Every expert fills once per layer at most, and nothing is evicted.
                assert_eq!(s.evictions, 0, "{label}: evictions with a slot per expert");
            }
            if n < 2 * k {
                assert!(s.evictions > 0, "{label}: no evictions with {n} slots for top-{k}");
            }
        }
    }
}

#[test]
fn cpu_streamed_experts_match_transformers() {
    for name in MODELS {
        for (form, reference) in FORMS {
            check_form(name, form, reference, "cpu", &[0, 1, 2], &|m, slots| {
                Some(Box::new(CpuBackend::with_experts(m.cfg.clone(), m.weights.clone(), 256, slots).unwrap()))
            });
        }
    }
}

#[test]
fn wgpu_streamed_experts_match_transformers() {
    for name in MODELS {
        // lavapipe runs ~7 decode steps/s on these models: every prompt on tiny-moe, the long one
        // (40 tokens, crossing the window) on the others.
        let which: &[usize] = if name == "tiny-moe" { &[0, 1, 2] } else { &[2] };
        for (form, reference) in FORMS {
            // Streamed steps run every layer for every prompt token (the prompt tail needs the
            // step in one command buffer; streaming hands the router's picks to the host
            // mid-step), so the resident modes do too here, and every mode stays bitwise the
            // first. tests/fixtures.rs checks the tail on the MoE fixture against transformers.
            check_form(name, form, reference, "wgpu", which, &|m, slots| {
                let opts = WgpuOptions {
                    max_ctx: 256,
                    max_chunk: CHUNK,
                    max_binding: None,
                    expert_slots: slots,
                    tuning: Tuning { prompt_tail: false, ..Tuning::default() },
                    ..Default::default()
                };
                wgpu_backend(m, opts).map(|b| Box::new(b) as Box<dyn Backend>)
            });
        }
    }
}

/// The Metal kernels through the MSL emulator: the checkpoint's stacked experts, an
/// installation with every expert resident (one launch per step), and streamed through as many
/// slots as experts and through 2k − 1 (the step split after each MoE layer's router, the host
/// loading the routed experts): ids equal transformers', logits bitwise equal across the modes.
/// Every MoE fixture, both forms, the long prompt (40 tokens, crossing the window).
#[test]
fn msl_emu_streamed_experts_match_transformers() {
    for name in MODELS {
        for (form, reference) in FORMS {
            let k = open_model(name, form).cfg.text.top_k_experts;
            check_form_from(name, form, reference, "msl-emu", &[2], k, &|m, slots| {
                let opts = MetalOptions { max_ctx: 256, expert_slots: slots, ..Default::default() };
                Some(Box::new(MetalBackend::emulated(m.cfg.clone(), m.weights.clone(), opts).unwrap()))
            });
        }
    }
}

/// Fewer slots than a token's top-k: the Metal kernels route one token's experts at once, so
/// such a build is refused with an error naming the flag and the least that works.
#[test]
fn msl_emu_refuses_fewer_slots_than_top_k() {
    let (_tmp, dir) = install_fixture("tiny-moe", "mlx-4bit", "msl-few");
    let m = Model::open(&dir).unwrap();
    let k = m.cfg.text.top_k_experts;
    let opts = MetalOptions { max_ctx: 64, expert_slots: ExpertSlots::Some(k - 1), ..Default::default() };
    let e = MetalBackend::emulated(m.cfg.clone(), m.weights.clone(), opts).err().expect("refused");
    assert!(e.to_string().contains("--expert-slots") && e.to_string().contains(&k.to_string()), "{e}");
}

/// Decode and verify steps of a resident MoE model run the dense branch's two mat-vecs beside
/// the routed experts' two (`Tuning::moe_overlap`): the same kernels on the same inputs,
/// with their own output buffers and no barrier between each pair. Where it applies (the MLX
/// 4-bit forms, whose dense gate and up are stacked into the one-dispatch GeGLU mat-vec) the
/// overlap must be recorded for both pairs of every MoE layer with the option on, for none with
/// it off, and the logits must be bitwise those of the branches run one after the other.
///
/// The HF forms keep the dense gate and up as two matrices (no stacked GeGLU mat-vec), so the
/// overlap cannot apply there: the option must record no pair and leave the program as it is
/// (the listings equal), and their logits are not compared, as the two builds run the same
/// program and the comparison could not fail.
#[test]
fn wgpu_moe_overlap_is_bitwise_the_serial_branches() {
    for name in MODELS {
        for (form, reference) in FORMS {
            let model = open_model(name, form);
            let make = |moe_overlap| {
                common::wgpu_backend(
                    &model,
                    WgpuOptions {
                        max_ctx: 256,
                        max_chunk: CHUNK,
                        tuning: Tuning { moe_overlap, ..Tuning::default() },
                        ..Default::default()
                    },
                )
            };
            let (Some(mut on), Some(mut off)) = (make(true), make(false)) else { return };
            let label = format!("{name}/{form}");
            assert_eq!(off.overlapped_pairs(), 0, "{label}: overlap off");
            if form != "mlx-4bit" {
                assert_eq!(on.overlapped_pairs(), 0, "{label}: unstacked dense gate/up cannot overlap");
                assert_eq!(on.program_listing(), off.program_listing(), "{label}: the option changed the program");
                eprintln!("{label}: no stacked dense gate/up, no overlap (program unchanged)");
                continue;
            }
            assert_eq!(on.overlapped_pairs(), 2 * model.cfg.layers.len(), "{label}: pairs recorded");
            assert_ne!(on.program_listing(), off.program_listing(), "{label}: the overlap changed no dispatch");
            eprintln!(
                "{label}: {} overlapped pairs, {} decode dispatches",
                on.overlapped_pairs(),
                on.decode_dispatches(0)
            );
            // One prompt per form (a prompt's 48 steps run every pair of every layer 48 times).
            for r in load_refs(name, reference).iter().take(1) {
                let (ids_on, logits_on) = run_prompt(&mut on, r);
                let (ids_off, logits_off) = run_prompt(&mut off, r);
                assert_eq!(ids_on, ids_off, "{label}: ids");
                for (step, (a, b)) in logits_on.iter().zip(&logits_off).enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{label}: step {step} logits differ (max {:e})", max_abs_diff(a, b));
                }
            }
        }
    }
}
