//! End to end against transformers: every fixture model, HF (bf16 weights) and MLX 4-bit
//! forms, on every backend. Generated ids must equal the reference exactly; every prompt row's
//! and every step's logits must agree within the form's tolerance (`common::logit_tol`, where
//! the tolerances are argued from the arithmetic and the measured errors: below half the
//! smallest top-1/top-2 margin of any reference step, so no greedy id can flip within them).

mod common;

use common::*;
use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::metal::{MetalBackend, MetalOptions};
use kestrel::backend::wgpu::{WgpuBackend, WgpuOptions};
use kestrel::backend::{Backend, Readback};
use kestrel::kernels::Tuning;
use kestrel::model::Model;

/// Teacher-forced check of one prompt: prefill, each chunk reading back `rows` (`AllLogits`:
/// every row, each compared with the reference's prompt logits; `LastLogits`: the chunk's last
/// row, the form in which the wgpu backend runs the layers past the last K/V write for that row
/// alone; `Nothing`: no row but the last chunk's last, as `generate` runs a long prompt), then
/// one decode step per reference token; returns the ids the backend would have chosen and the
/// largest logit difference seen.
fn check_prompt(b: &mut dyn Backend, r: &PromptRef, chunk: usize, rows: Readback, tol: f32, label: &str) -> f32 {
    b.reset();
    let vocab = b.config().text.vocab_size;
    let mut worst = 0.0f32;
    let mut pos = 0;
    let mut last = None;
    for piece in r.prompt.chunks(chunk) {
        let is_last = pos + piece.len() == r.prompt.len();
        let rb = match rows {
            Readback::Nothing if is_last => Readback::LastLogits,
            rb => rb,
        };
        let out = b.prefill(piece, pos, rb).unwrap();
        let read = match rb {
            Readback::AllLogits => piece.len(),
            Readback::Nothing => 0,
            _ => 1,
        };
        let first = pos + piece.len() - read;
        assert_eq!(out.logits.len(), read * vocab, "{label}: rows read back");
        for (i, row) in out.logits.chunks(vocab).enumerate() {
            let d = max_abs_diff(row, &r.prompt_logits[first + i]);
            assert!(d <= tol, "{label}: prompt row {} logits differ by {d} > {tol}", first + i);
            worst = worst.max(d);
        }
        pos += piece.len();
        last = Some(out);
    }
    let last = last.unwrap();
    let mut logits = last.logits[last.logits.len() - vocab..].to_vec();
    let mut chosen = vec![*last.argmax.last().unwrap()];
    for step in 0..r.generated.len() {
        let d = max_abs_diff(&logits, &r.step_logits[step]);
        assert!(d <= tol, "{label}: step {step} logits differ by {d} > {tol}");
        worst = worst.max(d);
        if step + 1 == r.generated.len() {
            break;
        }
        let out = b.decode(r.generated[step], pos, Readback::LastLogits).unwrap();
        pos += 1;
        logits = out.logits;
        chosen.push(out.argmax[0]);
    }
    assert_eq!(chosen, r.generated, "{label}: greedy ids differ from transformers");
    worst
}

fn run_all(
    models: &[&str],
    make: &mut dyn FnMut(&kestrel::model::Model) -> Option<Box<dyn Backend>>,
    chunk: usize,
    rows: Readback,
    tag: &str,
) {
    run_forms(models, &FORMS, make, chunk, rows, tag)
}

/// `run_all` over the weight forms `forms` only.
fn run_forms(
    models: &[&str],
    forms: &[(&str, &str)],
    make: &mut dyn FnMut(&kestrel::model::Model) -> Option<Box<dyn Backend>>,
    chunk: usize,
    rows: Readback,
    tag: &str,
) {
    for name in models {
        for &(form, reference) in forms {
            let model = open_model(name, form);
            let Some(mut b) = make(&model) else { return };
            for (i, r) in load_refs(name, reference).iter().enumerate() {
                let label = format!("{tag} {name}/{form} prompt {i} (chunk {chunk})");
                let worst = check_prompt(b.as_mut(), r, chunk, rows, logit_tol(form), &label);
                eprintln!("{label}: OK, 48 ids equal, max |Δlogit| = {worst:.2e}");
            }
        }
    }
}

/// Builds the variant `opts` of `m` and, beside it, the default build with the same context and
/// chunk, and hands both to `took_effect`, which asserts what the variant's option changes in
/// the recorded program: an option the builder ignored would leave the variant's program the
/// default one, which the other tests already run, and its test would pass without covering
/// anything.
fn variant(
    m: &Model,
    opts: WgpuOptions,
    took_effect: &dyn Fn(&str, &WgpuBackend, &WgpuBackend),
) -> Option<Box<dyn Backend>> {
    let base = WgpuOptions { max_ctx: opts.max_ctx, max_chunk: opts.max_chunk, ..Default::default() };
    let v = common::wgpu_backend(m, opts)?;
    let d = common::wgpu_backend(m, base).expect("the default build runs where the variant does");
    took_effect(&m.source, &v, &d);
    Some(Box::new(v))
}

#[test]
fn cpu_reference_matches_transformers() {
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| Some(Box::new(CpuBackend::new(m.cfg.clone(), m.weights.clone(), 4096))),
        128,
        Readback::AllLogits,
        "cpu",
    );
}

/// The Metal kernels (one launch per token) through the MSL emulator: every fixture model
/// (dense and MoE, experts resident), both weight forms, every prompt row and step within the
/// form's tolerance, greedy ids exact.
#[test]
fn msl_emu_matches_transformers() {
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| {
            Some(Box::new(
                MetalBackend::emulated(
                    m.cfg.clone(),
                    m.weights.clone(),
                    MetalOptions { max_ctx: 256, ..Default::default() },
                )
                .expect("the msl-emu backend builds (it needs clang++)"),
            ))
        },
        128,
        Readback::AllLogits,
        "msl-emu",
    );
}

/// `Backend::prefill_prompt`, the prompt loop of generate, the speculative driver and the bench:
/// 7-token chunks, those before the last reading back nothing, end with the reference's last
/// prompt row and its argmax, which is the first generated id; an empty prompt is an error.
#[test]
fn prefill_prompt_in_chunks_matches_transformers() {
    let model = open_model("tiny-e2b", "hf");
    let mut b = CpuBackend::new(model.cfg.clone(), model.weights.clone(), 4096);
    for r in load_refs("tiny-e2b", "reference") {
        let out = b.prefill_prompt(&r.prompt, 7, Readback::LastLogits).unwrap();
        let d = max_abs_diff(&out.logits, &r.prompt_logits[r.prompt.len() - 1]);
        assert!(d <= HF_LOGIT_TOL, "last prompt row differs by {d} > {HF_LOGIT_TOL}");
        assert_eq!(out.argmax, vec![r.generated[0]]);
        b.reset();
    }
    assert!(b.prefill_prompt(&[], 7, Readback::Argmax).is_err());
}

/// The tolerances hold what they promise (common::logit_tol): below half the top-1/top-2
/// margin of every step of every reference, so a run within them picks the reference's ids.
#[test]
fn tolerances_leave_every_greedy_step_its_margin() {
    for name in ["tiny-e2b", "tiny-e4b", "tiny-moe", "tiny-moe-k8", "tiny-moe-e8"] {
        for (form, reference) in FORMS {
            let tol = logit_tol(form);
            for (i, r) in load_refs(name, reference).iter().enumerate() {
                for (step, row) in r.step_logits.iter().enumerate() {
                    let mut top = [f32::MIN; 2];
                    for &x in row {
                        if x > top[0] {
                            top = [x, top[0]];
                        } else if x > top[1] {
                            top[1] = x;
                        }
                    }
                    let margin = top[0] - top[1];
                    assert!(
                        2.0 * tol < margin,
                        "{name}/{reference} prompt {i} step {step}: margin {margin:.3e} ≤ 2 × tolerance {tol:.1e}"
                    );
                }
            }
        }
    }
}

#[test]
fn wgpu_matches_transformers() {
    for chunk in [128, 7] {
        run_all(
            &["tiny-e2b", "tiny-e4b", "tiny-moe"],
            &mut |m| {
                common::wgpu_backend(
                    m,
                    WgpuOptions { max_ctx: 256, max_chunk: chunk, max_binding: None, ..Default::default() },
                )
                .map(|b| Box::new(b) as Box<dyn Backend>)
            },
            chunk,
            Readback::AllLogits,
            "wgpu",
        );
    }
}

/// A prompt's layers past its last K/V write for its last token alone
/// (`Tuning::prompt_tail`, on by default): a chunk that reads back its last row runs the
/// program up to the last KV-owning layer's attention for all its tokens and the rest as a
/// decode step of the last one (tiny-e2b: from layer 4's attention of 10, tiny-e4b: layer 5's
/// of 12, tiny-moe: the last layer's), and a chunk that reads back nothing stops there. Whole
/// prompts with their last row read back, then 7-token chunks reading back nothing but the
/// last: the logits against the reference's, then the decode steps on the cache they left.
#[test]
fn wgpu_prompt_tail_matches_transformers() {
    for (chunk, rows) in [(128, Readback::LastLogits), (7, Readback::Nothing)] {
        run_all(
            &["tiny-e2b", "tiny-e4b", "tiny-moe"],
            &mut |m| {
                let b = common::wgpu_backend(m, WgpuOptions { max_ctx: 256, max_chunk: chunk, ..Default::default() })?;
                // The tail starts at the last KV-owning layer (the last layer without KV sharing).
                let owners = m.cfg.layers.len() - m.cfg.text.num_kv_shared_layers;
                assert_eq!(b.prompt_tail_layer(), Some(owners - 1), "{}: prompt tail layer", m.source);
                Some(Box::new(b) as Box<dyn Backend>)
            },
            chunk,
            rows,
            "wgpu-prompt-tail",
        );
    }
}

/// Every norm its own dispatch: residual norms (`fuse_norms_up_to: 0`: the decode path of hidden
/// sizes past PRO_MAX_HIDDEN (E4B, 26B), which the fixtures' small hidden sizes would otherwise
/// never run, as by default their decode steps compute the norms inside the next mat-vec) and
/// the KV-sharing layers' q norm (`fold_q_norm: false`: head_norm_rope, not attention_split).
/// The default builds of every fixture and form fuse some norm (q norms into attention; in the
/// 4-bit forms residual norms into the mat-vecs); the variant's program must name no fused
/// kernel and its decode step must run more dispatches.
#[test]
fn wgpu_unfused_norms_match_transformers() {
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| {
            let opts = WgpuOptions {
                max_ctx: 256,
                max_chunk: 128,
                tuning: Tuning { fuse_norms_up_to: 0, fold_q_norm: false, ..Tuning::default() },
                ..Default::default()
            };
            variant(m, opts, &|label, v, d| {
                let fused = fused_norm_labels(&d.program_listing());
                assert!(fused > 0, "{label}: the default build fuses no norm, so this test covers nothing");
                assert_eq!(fused_norm_labels(&v.program_listing()), 0, "{label}: fused norms left");
                assert!(
                    v.decode_dispatches(0) > d.decode_dispatches(0),
                    "{label}: {} decode dispatches unfused, {} fused",
                    v.decode_dispatches(0),
                    d.decode_dispatches(0)
                );
            })
        },
        128,
        Readback::AllLogits,
        "wgpu-unfused",
    );
}

/// Every chunk mat-mat split in k (`min_k_splits: 4`: the fixtures are too small for the rule
/// to split any) and the residual norms reading the partials themselves (`norm_splits`, the
/// rows form over partials, instead of a qmm_sum pass before them). The split is a form of the
/// 4-bit mat-mat (qmm): the variant's program must have split grids (`tokens/T*S`, S > 1) and
/// norms over partials (`rmsnorm_rows…_parts`), which the default's has not. The bf16 chunk
/// mat-mats have no split form, so on the HF forms the option must leave the program as it is,
/// and those are not run (they would repeat wgpu_matches_transformers' chunk-128 run).
#[test]
fn wgpu_split_k_and_norms_over_partials_match_transformers() {
    let models = ["tiny-e2b", "tiny-e4b", "tiny-moe"];
    let opts = WgpuOptions { max_ctx: 256, max_chunk: 128, min_k_splits: 4, ..Default::default() };
    fn split_grids(listing: &str) -> usize {
        listing
            .split_whitespace()
            .filter(|t| t.starts_with("tokens/"))
            .filter(|t| t.split_once('*').is_some_and(|(_, s)| s.parse::<u32>().unwrap() > 1))
            .count()
    }
    fn parts_norms(listing: &str) -> usize {
        kernel_labels(listing).into_iter().filter(|l| l.starts_with("rmsnorm_rows") && l.ends_with("_parts")).count()
    }
    for name in models {
        let m = open_model(name, "hf");
        let Some(v) = common::wgpu_backend(&m, opts.clone()) else { return };
        let d = common::wgpu_backend(&m, WgpuOptions { max_ctx: 256, max_chunk: 128, ..Default::default() }).unwrap();
        assert_eq!(v.program_listing(), d.program_listing(), "{name}/hf: split-k changed a bf16 program");
    }
    let forms: Vec<(&str, &str)> = FORMS.into_iter().filter(|(f, _)| *f == "mlx-4bit").collect();
    run_forms(
        &models,
        &forms,
        &mut |m| {
            variant(m, opts.clone(), &|label, v, d| {
                let (vl, dl) = (v.program_listing(), d.program_listing());
                // The SIMT mat-mat's rule splits none of these small matrices, so there the option
                // is what splits them. The tensor-core rule (GPUs with cooperative matrices)
                // already splits them in the default build, often 4 or 8 ways: there the variant
                // must split at least as many, and the default's own run covers the path.
                if !dl.contains("qmm_coop") {
                    assert_eq!((split_grids(&dl), parts_norms(&dl)), (0, 0), "{label}: the default build splits");
                }
                assert!(split_grids(&vl) >= split_grids(&dl), "{label}: fewer mat-mats split than by default");
                assert!(split_grids(&vl) > 0, "{label}: no mat-mat split in k");
                assert!(parts_norms(&vl) > 0, "{label}: no norm reads split-k partials");
            })
        },
        128,
        Readback::AllLogits,
        "wgpu-split-k",
    );
}

/// A 4 KiB cap on one binding: every weight above it is split into row ranges, each its own
/// buffer and dispatch.
fn check_split_tensors(label: &str, v: &WgpuBackend, d: &WgpuBackend) {
    assert_eq!(v.gpu().max_binding, 4096, "{label}: binding cap");
    let (vl, dl) = (v.program_listing(), d.program_listing());
    assert!(
        vl.lines().count() > dl.lines().count() && listed_buffers(&vl) > listed_buffers(&dl),
        "{label}: split weights should add dispatches and buffers: {} dispatches on {} buffers vs {} on {}",
        vl.lines().count(),
        listed_buffers(&vl),
        dl.lines().count(),
        listed_buffers(&dl)
    );
}

#[test]
fn wgpu_split_tensors_match_transformers() {
    // A 4 KiB binding cap splits every weight into many row ranges (the mechanism that keeps
    // real checkpoints under 128 MiB on lavapipe and 2 GiB on Vulkan).
    run_all(
        &["tiny-e2b"],
        &mut |m| {
            let opts = WgpuOptions { max_ctx: 256, max_chunk: 16, max_binding: Some(4096), ..Default::default() };
            variant(m, opts, &check_split_tensors)
        },
        16,
        Readback::AllLogits,
        "wgpu-split",
    );
}

#[test]
fn wgpu_decode_attention_both_forms_match_transformers() {
    // Decode rows of at most 40 keys through attention_short, longer ones through
    // attention_split + attention_combine (WgpuOptions::attn_short): the fixtures' prompts of
    // 8 and 30 tokens cross the bound while their 48 tokens decode (the sliding layers, window
    // 16, stay short), the long one starts past it. The other tests run the default bound, past
    // every fixture's context: attention_short alone. So a decode step past the bound runs more
    // dispatches than one before it (two attention kernels per full layer instead of one),
    // and in the default build the two count the same.
    let last = 40 + 48 - 1; // the long prompt's last decode position
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| {
            let opts = WgpuOptions {
                max_ctx: 256,
                max_chunk: 16,
                tuning: Tuning { attn_short: 40, ..Tuning::default() },
                ..Default::default()
            };
            variant(m, opts, &|label, v, d| {
                assert_eq!(d.decode_dispatches(last), d.decode_dispatches(0), "{label}: default bound crossed");
                assert!(
                    v.decode_dispatches(last) > v.decode_dispatches(0),
                    "{label}: a decode step at {last} runs attention_short as one at 0 does"
                );
            })
        },
        16,
        Readback::AllLogits,
        "wgpu-short-bound",
    );
}

/// Queue submissions a step makes: `Queue::submit` numbers submissions in order, so an empty
/// submit before and after a step tells how many the step made. wgpu (pinned) prints a
/// `SubmissionIndex` as `SubmissionIndex { index: N }`; a format without that number fails.
fn submission_index(b: &WgpuBackend) -> u64 {
    let s = format!("{:?}", b.gpu().queue.submit([]));
    let n = s.split_once("index:").map(|(_, n)| n.trim().trim_end_matches('}').trim());
    n.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no submission number in {s:?}"))
}

fn submits_of(b: &mut WgpuBackend, step: impl FnOnce(&mut WgpuBackend)) -> u64 {
    let before = submission_index(b);
    step(b);
    submission_index(b) - before - 1
}

#[test]
fn wgpu_one_submit_per_step_matches_transformers() {
    // Every step in one command buffer (segments off: the form profiled steps take, and
    // `submit_segments=off`); the other tests run the default, steps submitted in segments
    // of 16, 32, 64, … program entries while recorded. 16-token chunks through a model split
    // into many small bindings. The recorded program is the same either way (the listings are
    // equal); what differs is how many queue submissions a step makes, which is counted here:
    // a step of the variant must make fewer than the default's.
    let r = &load_refs("tiny-e2b", "reference")[0];
    run_all(
        &["tiny-e2b"],
        &mut |m| {
            let opts = WgpuOptions {
                max_ctx: 256,
                max_chunk: 16,
                max_binding: Some(4096),
                tuning: Tuning { submit_segments: false, ..Tuning::default() },
                ..Default::default()
            };
            let one = common::wgpu_backend(m, opts.clone())?;
            let mut seg = common::wgpu_backend(
                m,
                WgpuOptions { tuning: Tuning { submit_segments: true, ..opts.tuning.clone() }, ..opts },
            )
            .unwrap();
            assert_eq!(one.program_listing(), seg.program_listing(), "{}: segments changed the program", m.source);
            let mut one = one;
            let chunk = |b: &mut WgpuBackend| {
                b.prefill(&r.prompt[..16], 0, Readback::AllLogits).unwrap();
            };
            let (n_one, n_seg) = (submits_of(&mut one, chunk), submits_of(&mut seg, chunk));
            assert!(n_one < n_seg, "{}: {n_one} submits per chunk unsegmented, {n_seg} segmented", m.source);
            eprintln!("{}: a 16-token chunk in {n_one} submits unsegmented, {n_seg} segmented", m.source);
            Some(Box::new(one) as Box<dyn Backend>)
        },
        16,
        Readback::AllLogits,
        "wgpu-one-submit",
    );
}
