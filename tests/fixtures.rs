//! End to end against transformers: every fixture model, HF (bf16 weights) and MLX 4-bit
//! forms, on every backend. Generated ids must equal the reference exactly; every prompt row's
//! and every step's logits must agree within the form's tolerance (`common::logit_tol`, where
//! the tolerances are argued from the arithmetic and the measured errors: below half the
//! smallest top-1/top-2 margin of any reference step, so no greedy id can flip within them).

mod common;

use common::*;
use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::wgpu::WgpuOptions;
use kestrel::backend::{Backend, Readback};
use kestrel::kernels::Tuning;

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
    for name in models {
        for (form, reference) in FORMS {
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
/// (`WgpuOptions::prompt_tail`, on by default): a chunk that reads back its last row runs the
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
                common::wgpu_backend(m, WgpuOptions { max_ctx: 256, max_chunk: chunk, ..Default::default() })
                    .map(|b| Box::new(b) as Box<dyn Backend>)
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
            common::wgpu_backend(m, opts).map(|b| Box::new(b) as Box<dyn Backend>)
        },
        128,
        Readback::AllLogits,
        "wgpu-unfused",
    );
}

/// Every chunk mat-mat split in k (`min_k_splits: 4`: the fixtures are too small for the rule
/// to split any) and the residual norms reading the partials themselves (`norm_splits`, the
/// rows form over partials, instead of a qmm_sum pass before them).
#[test]
fn wgpu_split_k_and_norms_over_partials_match_transformers() {
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| {
            let opts = WgpuOptions { max_ctx: 256, max_chunk: 128, min_k_splits: 4, ..Default::default() };
            common::wgpu_backend(m, opts).map(|b| Box::new(b) as Box<dyn Backend>)
        },
        128,
        Readback::AllLogits,
        "wgpu-split-k",
    );
}

#[test]
fn wgpu_split_tensors_match_transformers() {
    // A 4 KiB binding cap splits every weight into many row ranges (the mechanism that keeps
    // real checkpoints under 128 MiB on lavapipe and 2 GiB on Vulkan).
    run_all(
        &["tiny-e2b"],
        &mut |m| {
            common::wgpu_backend(
                m,
                WgpuOptions { max_ctx: 256, max_chunk: 16, max_binding: Some(4096), ..Default::default() },
            )
            .map(|b| Box::new(b) as Box<dyn Backend>)
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
    // every fixture's context: attention_short alone.
    run_all(
        &["tiny-e2b", "tiny-e4b", "tiny-moe"],
        &mut |m| {
            common::wgpu_backend(
                m,
                WgpuOptions {
                    max_ctx: 256,
                    max_chunk: 16,
                    tuning: Tuning { attn_short: 40, ..Tuning::default() },
                    ..Default::default()
                },
            )
            .map(|b| Box::new(b) as Box<dyn Backend>)
        },
        16,
        Readback::AllLogits,
        "wgpu-short-bound",
    );
}

#[test]
fn wgpu_one_submit_per_step_matches_transformers() {
    // Every step in one command buffer (segments off: the form profiled steps take, and
    // KESTREL_SUBMIT_SEGMENTS=0); the other tests run the default, steps submitted in segments
    // of 16, 32, 64, … program entries while recorded. 16-token chunks through a model split
    // into many small bindings.
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
            common::wgpu_backend(m, opts).map(|b| Box::new(b) as Box<dyn Backend>)
        },
        16,
        Readback::AllLogits,
        "wgpu-one-submit",
    );
}
