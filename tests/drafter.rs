//! The MTP drafter (`kestrel::spec`) against transformers' `Gemma4AssistantForCausalLM`: the
//! first drafting round after prefill of each reference prompt, for both assistant fixtures,
//! HF (bf16 weights) and MLX 4-bit forms (the 4-bit drafter against the trace of its exactly
//! dequantised weights). Both references ran the f32 HF-form target, so every test here does too.
//!
//! Two views of the same round:
//! - `drafter_steps_match_transformers`: each step fed transformers' own inputs (its
//!   `inputs_embeds`, its target K/V), so any difference is the drafter's alone;
//! - `first_round_from_cpu_target_matches_transformers`: the whole round driven from a prefilled
//!   CPU target through `DraftContext`, as a speculative decoder will run it.
//!
//! Tolerances. Both sides compute in f32 from identical weights; they differ only by rounding
//! and summation order (transformers sums matmuls in f32, Kestrel's reference in f64, so the
//! difference is transformers' own rounding, about 6e-8 relative per operation). One drafter
//! step is 4 layers plus two projections with |logit| up to ~20; f32 rounding compounded over
//! that depth gives ~1e-5 absolute (measured ≤ 7.2e-6 on logits, 1.7e-6 on projected hiddens),
//! so STEP_TOL = 5e-5 for a step fed identical inputs. The end-to-end round adds the target's
//! own error in its hidden and K/V (measured ≤ 4e-6) and chains four steps, each feeding its
//! projected hidden to the next (measured ≤ 1.8e-5): ROUND_TOL = 1e-4. Draft tokens must be
//! equal; the smallest top-1/top-2 margin in the references (2.5e-3, printed) is 25× ROUND_TOL,
//! so an honest rounding difference cannot flip one.

mod common;

use common::*;
use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::{Backend, Readback};
use kestrel::config::AttnKind;
use kestrel::loader::{SafetensorsFile, TensorStore};
use kestrel::quant;
use kestrel::spec::{DraftContext, DraftKv, Drafter, KvRows, StepInput};

const STEP_TOL: f32 = 5e-5;
const ROUND_TOL: f32 = 1e-4;

/// (assistant fixture, its target fixture).
const PAIRS: [(&str, &str); 2] = [("tiny-e2b-assistant", "tiny-e2b"), ("tiny-moe-assistant", "tiny-moe")];

/// One reference drafting step.
struct StepRef {
    token: u32,
    inputs_embeds: Vec<f32>,
    logits: Vec<f32>,
    projected: Vec<f32>,
}

/// The first drafting round of one prompt.
struct RoundRef {
    prompt: Vec<u32>,
    first_token: u32,
    target_hidden: Vec<f32>,
    /// Target K/V of every prompt position, `[sliding, full]`.
    kv: [KvRows; 2],
    steps: Vec<StepRef>,
}

fn floats(store: &TensorStore, name: &str) -> (Vec<f32>, Vec<usize>) {
    let t = store.get(name).unwrap_or_else(|| panic!("reference lacks {name}"));
    (quant::floats_to_f32(t.bytes(), t.dtype()), t.shape().to_vec())
}

/// The reference stores K/V head-major, `[kv_heads, T, d]`; the cache layout is `[T][kv_heads·d]`.
fn kv_rows(store: &TensorStore, prefix: &str) -> KvRows {
    let (k, shape) = floats(store, &format!("{prefix}.key"));
    let (v, _) = floats(store, &format!("{prefix}.value"));
    let (nh, n, d) = (shape[0], shape[1], shape[2]);
    let to_rows = |x: &[f32]| {
        let mut out = vec![0.0f32; x.len()];
        for h in 0..nh {
            for t in 0..n {
                out[(t * nh + h) * d..][..d].copy_from_slice(&x[(h * n + t) * d..][..d]);
            }
        }
        out
    };
    KvRows { start: 0, k: to_rows(&k), v: to_rows(&v), n_kv_heads: nh, head_dim: d }
}

/// The rounds of `assistant`'s reference for weight form `form` (`hf` or `mlx-4bit`).
fn load_rounds(assistant: &str, form: &str) -> Vec<RoundRef> {
    let dir = fixtures().join(assistant).join("ref");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("drafter_reference.json")).unwrap()).unwrap();
    let open = |f: &str| TensorStore::from_files(vec![SafetensorsFile::open(&dir.join(f)).unwrap()]);
    let base = open("drafter_reference.safetensors");
    let steps_store = if form == "hf" {
        open("drafter_reference.safetensors")
    } else {
        open("drafter_dequant4bit_reference.safetensors")
    };
    json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tokens: Vec<u32> = if form == "hf" {
                p["steps"].as_array().unwrap().iter().map(|s| s["drafted_token"].as_u64().unwrap() as u32).collect()
            } else {
                json["dequant4bit_drafted_tokens"][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect()
            };
            let t = base.get(&format!("p{i}.prompt_ids")).unwrap();
            let prompt: Vec<u32> =
                t.bytes().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
            assert_eq!(prompt.len() as u64, p["prompt_len"].as_u64().unwrap());
            for s in p["steps"].as_array().unwrap() {
                assert_eq!(
                    s["position_id"].as_u64().unwrap() as usize,
                    prompt.len(),
                    "reference drafts at position = prompt length"
                );
            }
            RoundRef {
                first_token: p["target_first_token"].as_u64().unwrap() as u32,
                target_hidden: floats(&base, &format!("p{i}.target_last_hidden")).0,
                kv: [
                    kv_rows(&base, &format!("p{i}.shared_kv.sliding_attention")),
                    kv_rows(&base, &format!("p{i}.shared_kv.full_attention")),
                ],
                steps: tokens
                    .iter()
                    .enumerate()
                    .map(|(s, &token)| StepRef {
                        token,
                        inputs_embeds: floats(&steps_store, &format!("p{i}.step{s}.inputs_embeds")).0,
                        logits: floats(&steps_store, &format!("p{i}.step{s}.logits")).0,
                        projected: floats(&steps_store, &format!("p{i}.step{s}.projected_hidden")).0,
                    })
                    .collect(),
                prompt,
            }
        })
        .collect()
}

/// Rows `range` of `kv`.
fn slice(kv: &KvRows, range: std::ops::Range<usize>) -> KvRows {
    let w = kv.n_kv_heads * kv.head_dim;
    KvRows {
        start: range.start,
        k: kv.k[range.start * w..range.end * w].to_vec(),
        v: kv.v[range.start * w..range.end * w].to_vec(),
        n_kv_heads: kv.n_kv_heads,
        head_dim: kv.head_dim,
    }
}

/// Difference between the best and second-best logit.
fn top2_margin(logits: &[f32]) -> f32 {
    let mut v = logits.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

#[test]
fn drafter_steps_match_transformers() {
    for (assistant, _) in PAIRS {
        for (form, _) in FORMS {
            let model = open_model(assistant, form);
            let drafter = Drafter::from_model(&model).unwrap();
            let window = model.cfg.text.sliding_window;
            let hb = drafter.backbone_hidden();
            let (mut d_logit, mut d_hidden, mut margin) = (0.0f32, 0.0f32, f32::INFINITY);
            for (i, r) in load_rounds(assistant, form).iter().enumerate() {
                let p = r.prompt.len();
                let kv = DraftKv {
                    sliding: slice(&r.kv[0], DraftKv::visible(AttnKind::Sliding, p, window)),
                    full: slice(&r.kv[1], DraftKv::visible(AttnKind::Full, p, window)),
                };
                for (s, st) in r.steps.iter().enumerate() {
                    let (embedding, hidden) = st.inputs_embeds.split_at(hb);
                    let out = drafter.step(&StepInput { embedding, hidden, position: p, kv: &kv }).unwrap();
                    let label = format!("{assistant}/{form} prompt {i} step {s}");
                    assert_eq!(out.token, st.token, "{label}: draft token differs from transformers");
                    let dl = max_abs_diff(&out.logits, &st.logits);
                    let dh = max_abs_diff(&out.hidden, &st.projected);
                    assert!(
                        dl <= STEP_TOL && dh <= STEP_TOL,
                        "{label}: |Δlogit| {dl:.2e}, |Δhidden| {dh:.2e} > {STEP_TOL}"
                    );
                    (d_logit, d_hidden, margin) =
                        (d_logit.max(dl), d_hidden.max(dh), margin.min(top2_margin(&st.logits)));
                }
            }
            eprintln!(
                "{assistant}/{form}: 12 steps on transformers' inputs, tokens equal, max |Δlogit| = {d_logit:.2e}, max |Δhidden| = {d_hidden:.2e}, smallest top-2 margin {margin:.2e}"
            );
        }
    }
}

#[test]
fn first_round_from_cpu_target_matches_transformers() {
    for (assistant, target) in PAIRS {
        let tm = open_model(target, "hf");
        let mut b = CpuBackend::new(tm.cfg.clone(), tm.weights.clone(), 256);
        for (form, _) in FORMS {
            let model = open_model(assistant, form);
            let drafter = Drafter::from_model(&model).unwrap();
            drafter.check_target(&tm.cfg).unwrap();
            let (mut d_target, mut d_logit, mut d_hidden) = (0.0f32, 0.0f32, 0.0f32);
            for (i, r) in load_rounds(assistant, form).iter().enumerate() {
                let label = format!("{assistant}/{form} prompt {i}");
                b.reset();
                let out = b.prefill(&r.prompt, 0, Readback::Argmax).unwrap();
                assert_eq!(out.argmax, vec![r.first_token], "{label}: target's first token");

                // The target's side of the inputs: its last hidden and producer K/V.
                let p = r.prompt.len();
                let rows = b.last_hidden();
                d_target = d_target.max(max_abs_diff(&rows[rows.len() - r.target_hidden.len()..], &r.target_hidden));
                for (kind, want) in [(AttnKind::Sliding, &r.kv[0]), (AttnKind::Full, &r.kv[1])] {
                    let got = b.producer_kv(kind, 0..p).unwrap();
                    d_target = d_target.max(max_abs_diff(&got.k, &want.k)).max(max_abs_diff(&got.v, &want.v));
                }
                let emb = b.token_embedding(r.first_token).unwrap();
                let hb = drafter.backbone_hidden();
                d_target = d_target.max(max_abs_diff(&emb, &r.steps[0].inputs_embeds[..hb]));

                let steps = drafter.draft_after_step(&b, r.first_token, r.steps.len()).unwrap();
                let tokens: Vec<u32> = steps.iter().map(|s| s.token).collect();
                let want: Vec<u32> = r.steps.iter().map(|s| s.token).collect();
                assert_eq!(tokens, want, "{label}: draft tokens differ from transformers");
                for (s, (got, st)) in steps.iter().zip(&r.steps).enumerate() {
                    let dl = max_abs_diff(&got.logits, &st.logits);
                    let dh = max_abs_diff(&got.hidden, &st.projected);
                    assert!(
                        dl <= ROUND_TOL && dh <= ROUND_TOL,
                        "{label} step {s}: |Δlogit| {dl:.2e}, |Δhidden| {dh:.2e} > {ROUND_TOL}"
                    );
                    (d_logit, d_hidden) = (d_logit.max(dl), d_hidden.max(dh));
                }
            }
            assert!(d_target <= ROUND_TOL, "{assistant}/{form}: target inputs differ by {d_target:.2e}");
            eprintln!(
                "{assistant}/{form} on {target}/hf (cpu): 3 rounds of 4 drafts equal; target inputs max |Δ| = {d_target:.2e}, max |Δlogit| = {d_logit:.2e}, max |Δhidden| = {d_hidden:.2e}"
            );
        }
    }
}

/// The fixtures pin the sliding-layer window: transformers' drafter sees the last W + 1 target
/// positions (its flipped bidirectional mask), not the W a target query would. Prompts 0 and 2
/// are longer than W = 16, so the clean `p − W .. p` window must visibly miss the reference.
#[test]
fn sliding_window_is_w_plus_one() {
    let (assistant, form) = ("tiny-e2b-assistant", "hf");
    let model = open_model(assistant, form);
    let drafter = Drafter::from_model(&model).unwrap();
    let w = model.cfg.text.sliding_window;
    let hb = drafter.backbone_hidden();
    for (i, r) in load_rounds(assistant, form).iter().enumerate() {
        let p = r.prompt.len();
        let (embedding, hidden) = r.steps[0].inputs_embeds.split_at(hb);
        let mut diffs = Vec::new();
        for lo in [p.saturating_sub(w + 1), p.saturating_sub(w)] {
            let kv = DraftKv { sliding: slice(&r.kv[0], lo..p), full: slice(&r.kv[1], 0..p) };
            let out = drafter.step(&StepInput { embedding, hidden, position: p, kv: &kv }).unwrap();
            diffs.push(max_abs_diff(&out.logits, &r.steps[0].logits));
        }
        eprintln!(
            "prompt {i} (p = {p}, W = {w}): |Δlogit| with W+1 entries {:.2e}, with W entries {:.2e}",
            diffs[0], diffs[1]
        );
        assert!(diffs[0] <= STEP_TOL);
        if p > w {
            assert!(diffs[1] > 100.0 * STEP_TOL, "prompt {i}: the W-entry window should not match the reference");
        }
    }
}

/// The dense tied head (26B-style drafters; no fixture has one): with the centroid weights
/// removed, every token the centroid head scored gets the same logit from the dense head (the
/// same embedding rows and sums), and the dense argmax scores at least as high.
#[test]
fn dense_head_agrees_with_centroid_head() {
    for (assistant, _) in PAIRS {
        let model = open_model(assistant, "hf");
        let centroid = Drafter::from_model(&model).unwrap();
        let mut cfg = model.cfg.clone();
        cfg.assistant.as_mut().unwrap().use_ordered_embeddings = false;
        let mut w = std::sync::Arc::try_unwrap(open_model(assistant, "hf").weights).ok().unwrap();
        let aw = w.assistant.as_mut().unwrap();
        (aw.centroids, aw.token_ordering) = (None, None);
        let dense = Drafter::new(cfg, std::sync::Arc::new(w)).unwrap();
        let hb = centroid.backbone_hidden();
        let w_ = model.cfg.text.sliding_window;
        for r in load_rounds(assistant, "hf") {
            let p = r.prompt.len();
            let kv = DraftKv {
                sliding: slice(&r.kv[0], DraftKv::visible(AttnKind::Sliding, p, w_)),
                full: slice(&r.kv[1], 0..p),
            };
            let (embedding, hidden) = r.steps[0].inputs_embeds.split_at(hb);
            let input = StepInput { embedding, hidden, position: p, kv: &kv };
            let (c, d) = (centroid.step(&input).unwrap(), dense.step(&input).unwrap());
            assert_eq!(c.hidden, d.hidden);
            let fill = c.logits.iter().copied().fold(f32::INFINITY, f32::min);
            let scored: Vec<usize> = (0..c.logits.len()).filter(|&t| c.logits[t] > fill).collect();
            assert!(!scored.is_empty());
            for &t in &scored {
                assert_eq!(c.logits[t], d.logits[t], "token {t}");
            }
            assert!(d.logits[d.token as usize] >= c.logits[c.token as usize]);
        }
    }
}

#[test]
fn drafter_inputs_are_checked() {
    // A target is not a drafter.
    let tm = open_model("tiny-e2b", "hf");
    assert!(Drafter::from_model(&tm).is_err());
    // A drafter made for another target.
    let d = Drafter::from_model(&open_model("tiny-moe-assistant", "hf")).unwrap();
    let e = d.check_target(&tm.cfg).unwrap_err().to_string();
    assert!(e.contains("backbone_hidden_size"), "{e}");
    // Drafting before the target has run, or past its cache.
    let d = Drafter::from_model(&open_model("tiny-e2b-assistant", "hf")).unwrap();
    let mut b = CpuBackend::new(tm.cfg.clone(), tm.weights.clone(), 64);
    assert!(d.draft_after_step(&b, 5, 2).is_err());
    b.prefill(&[2, 10, 11], 0, Readback::Argmax).unwrap();
    let h = b.last_hidden()[2 * 128..].to_vec();
    assert!(d.draft_block(&b, 5, &h, 4, 2).is_err());
    assert!(d.draft_block(&b, 5, &h[1..], 3, 2).is_err());
    assert!(d.draft_block(&b, 9999, &h, 3, 2).is_err());
    assert_eq!(d.draft_block(&b, 5, &h, 3, 2).unwrap().len(), 2);
}
