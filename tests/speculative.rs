//! Speculative decoding with the MTP drafter gives exactly greedy decoding's output.
//!
//! For tiny-moe + tiny-moe-assistant (a "copy" drafter that gets many drafts accepted) and
//! tiny-e2b + tiny-e2b-assistant (random: almost nothing accepted), every fixture prompt,
//! k = 1..4 and 256 new tokens (16-token sliding window: crossed many times), the speculative
//! tokens equal plain greedy decoding's; runs are deterministic; generation stopped by a stop id
//! in the middle of an accepted block stops at the same token; and each verify row's logits are
//! bitwise those of sequential one-token decodes.

mod common;

use common::*;
use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::metal::{MetalBackend, MetalOptions};
use kestrel::backend::wgpu::{DraftModel, WgpuOptions};
use kestrel::backend::{Backend, Readback};
use kestrel::engine::speculative::{self, SpecStats};
use kestrel::engine::{self, GenerateParams};
use kestrel::kernels::Tuning;
use kestrel::model::Model;
use kestrel::sampler::{Sampler, SamplerConfig};
use kestrel::spec::Drafter;

const NEW: usize = 256;
const PAIRS: [(&str, &str); 2] = [("tiny-moe", "tiny-moe-assistant"), ("tiny-e2b", "tiny-e2b-assistant")];

fn params(stop_ids: Vec<u32>, ignore_eos: bool) -> GenerateParams {
    GenerateParams { max_new: NEW, stop_ids, ignore_eos, chunk: 16 }
}

fn cpu(model: &Model) -> Box<dyn Backend> {
    Box::new(CpuBackend::new(model.cfg.clone(), model.weights.clone(), 1024))
}

fn greedy(model: &Model, prompt: &[u32], p: &GenerateParams) -> Vec<u32> {
    greedy_on(cpu(model).as_mut(), prompt, p)
}

fn greedy_on(b: &mut dyn Backend, prompt: &[u32], p: &GenerateParams) -> Vec<u32> {
    let mut s = Sampler::new(SamplerConfig::default());
    engine::generate(b, prompt, p, &mut s, |_| Ok(())).unwrap().0
}

fn speculative(
    model: &Model,
    drafter: &Drafter,
    k: usize,
    prompt: &[u32],
    p: &GenerateParams,
) -> (Vec<u32>, SpecStats) {
    speculative_on(cpu(model).as_mut(), drafter, k, prompt, p)
}

fn speculative_on(
    b: &mut dyn Backend,
    drafter: &Drafter,
    k: usize,
    prompt: &[u32],
    p: &GenerateParams,
) -> (Vec<u32>, SpecStats) {
    let mut streamed = Vec::new();
    let (out, _, stats) = speculative::generate(b, drafter, k, prompt, p, |t| {
        streamed.push(t);
        Ok(())
    })
    .unwrap();
    assert_eq!(streamed, out, "tokens streamed through on_token differ from the returned ones");
    (out, stats)
}

/// Builds a backend with a drafter on its device (None: no GPU here).
type MakeDrafting<'a> = &'a dyn Fn(&Model, &Drafter) -> Option<Box<dyn Backend>>;

fn open_pair(target: &str, assistant: &str, form: &str) -> (Model, Drafter) {
    let model = open_model(target, form);
    let drafter = Drafter::from_model(&open_model(assistant, form)).unwrap();
    (model, drafter)
}

#[test]
fn speculative_equals_greedy_for_every_prompt_and_k() {
    for (target, assistant) in PAIRS {
        for form in ["hf", "mlx-4bit"] {
            let (model, drafter) = open_pair(target, assistant, form);
            for (i, r) in load_refs(target, "reference").iter().enumerate() {
                let p = params(model.stop_ids.clone(), true);
                let want = greedy(&model, &r.prompt, &p);
                assert_eq!(want.len(), NEW);
                // Every k on the HF form; the 4-bit form (same code path) at k = 2 and 4.
                let ks: &[usize] = if form == "hf" { &[1, 2, 3, 4] } else { &[2, 4] };
                for &k in ks {
                    let (got, st) = speculative(&model, &drafter, k, &r.prompt, &p);
                    assert_eq!(got, want, "{target}/{form} prompt {i} k={k}: speculative output differs from greedy");
                    eprintln!(
                        "{target}+{assistant} {form} prompt {i} k={k}: {NEW} tokens equal greedy; {} target passes, {:.2} tokens/pass, acceptance {:?}",
                        st.target_passes,
                        st.tokens_per_pass(),
                        st.acceptance().iter().map(|a| format!("{:.2}", a)).collect::<Vec<_>>()
                    );
                    if target == "tiny-moe" && k == 2 {
                        assert!(st.accepted[0] > 0, "the copy drafter should get drafts accepted");
                    }
                }
            }
        }
    }
}

#[test]
fn speculative_is_deterministic() {
    let (model, drafter) = open_pair("tiny-moe", "tiny-moe-assistant", "hf");
    let r = &load_refs("tiny-moe", "reference")[0];
    let p = params(model.stop_ids.clone(), true);
    let a = speculative(&model, &drafter, 3, &r.prompt, &p);
    let b = speculative(&model, &drafter, 3, &r.prompt, &p);
    assert_eq!(a, b);
}

/// A stop id met inside a block of accepted drafts ends generation at exactly that token.
#[test]
fn stop_id_inside_an_accepted_block() {
    check_stop_inside_a_block("cpu", &|m, _| Some(cpu(m)));
}

/// The same on wgpu with the GPU drafter, where rounds run ahead of the host: the stop lands
/// while a round past it is in flight.
#[test]
fn wgpu_stop_id_inside_an_accepted_block() {
    check_stop_inside_a_block("wgpu", &|m, d| wgpu_drafting(m, d));
}

fn check_stop_inside_a_block(tag: &str, make: MakeDrafting) {
    let (model, drafter) = open_pair("tiny-moe", "tiny-moe-assistant", "hf");
    let r = &load_refs("tiny-moe", "reference")[2];
    for k in [2, 4] {
        let Some(mut b) = make(&model, &drafter) else { return };
        // Without stops: which emitted tokens were accepted drafts?
        let (free, st) = speculative_on(b.as_mut(), &drafter, k, &r.prompt, &params(Vec::new(), true));
        // A token whose first occurrence was emitted as an accepted draft: as the stop id, the
        // run is identical up to there and must stop on that draft, mid-block.
        let at = (0..free.len())
            .find(|&i| st.from_draft[i] && !free[..i].contains(&free[i]))
            .expect("some token first appears as an accepted draft");
        let stop = free[at];
        let p = params(vec![stop], false);
        let want = greedy(&model, &r.prompt, &p);
        let (got, st) = speculative_on(b.as_mut(), &drafter, k, &r.prompt, &p);
        assert_eq!(got, want, "{tag}: stop id {stop}, k={k}");
        assert_eq!(got.len(), at + 1);
        assert!(st.from_draft.last() == Some(&true), "{tag} k={k}: the run did not stop on an accepted draft");
        eprintln!(
            "{tag} k={k}: stop id {stop} reached as accepted draft at output {at}: {} tokens, equal to greedy",
            got.len()
        );
    }
}

/// Each row of a verify pass has the logits a one-token decode at that position gives, bit for
/// bit; and rejected rows leave no trace in the cache.
#[test]
fn verify_logits_are_bitwise_sequential_decode() {
    check_verify_bitwise("cpu", &|m| Some(Box::new(CpuBackend::new(m.cfg.clone(), m.weights.clone(), 256))));
}

#[test]
fn wgpu_verify_logits_are_bitwise_sequential_decode() {
    check_verify_bitwise("wgpu", &|m| {
        wgpu_backend(m, WgpuOptions { max_ctx: 256, max_chunk: 16, ..Default::default() })
            .map(|b| Box::new(b) as Box<dyn Backend>)
    });
}

/// The Metal kernels through the MSL emulator.
#[test]
fn msl_emu_verify_logits_are_bitwise_sequential_decode() {
    check_verify_bitwise("msl-emu", &|m| Some(msl_emu(m)));
}

/// msl-emu with `d` packed beside the target: the engine then drafts with `draft_block` on the
/// device (`Backend::draft`).
fn msl_emu_drafting(m: &Model, d: &Drafter) -> Box<dyn Backend> {
    let opts =
        MetalOptions { max_ctx: 256, drafter: Some((d.config().clone(), d.weights().clone())), ..Default::default() };
    Box::new(MetalBackend::emulated(m.cfg.clone(), m.weights.clone(), opts).expect("the msl-emu backend builds"))
}

/// The device drafter (`draft_block` in msl/draft.metal, through the MSL emulator) proposes the
/// host drafter's tokens (`Drafter::draft_block`, the f32 reference) in every round: both pairs
/// (the centroid-masked head of tiny-e2b-assistant, the plain head of the copy drafter), both
/// forms, k = 3, twenty rounds after the long prompt (the sliding window wrapped), each round
/// committing what the target accepts.
#[test]
fn msl_emu_device_drafter_proposes_the_host_drafters_tokens() {
    check_device_drafts("msl-emu", &|m, d| Some(msl_emu_drafting(m, d)));
}

/// wgpu with `d` recorded beside the target (its drafter program over the target's caches).
fn wgpu_drafting(m: &Model, d: &Drafter) -> Option<Box<dyn Backend>> {
    let drafter = Some(DraftModel(d.config().clone(), d.weights().clone()));
    let b = wgpu_backend(m, WgpuOptions { max_ctx: 512, max_chunk: 16, drafter, ..Default::default() })?;
    Some(Box::new(b))
}

/// The wgpu drafter (builder/drafter.rs: the target's blocks over the drafter's config, the
/// centroid head of draft_select/score/pick.wgsl) proposes the host drafter's tokens: as
/// [`msl_emu_device_drafter_proposes_the_host_drafters_tokens`].
#[test]
fn wgpu_device_drafter_proposes_the_host_drafters_tokens() {
    check_device_drafts("wgpu", &|m, d| wgpu_drafting(m, d));
}

/// The GPU drafter's projected hidden (its whole forward before the head: the pre-projection,
/// four layers over the target's K/V, the final norm and the post-projection) against the host
/// drafter's `DraftStep::hidden`, after each of k = 1, 2, 3 chained steps, both pairs and forms.
/// Tolerance: the GPU sums in f32 (mat-vecs over at most 2 · 64 = 128 inputs here, attention over
/// ≤ 56 keys), the reference in f64: each f32 sum errs by about √n · 2⁻²⁴ relative, ≈ 1e-6, and
/// four residual layers with their norms grow that to about 1e-5 of the row's largest value;
/// 1e-4 leaves a factor of ten, while a wrong mask, rope position or kv head mapping moves the
/// row by tens of percent.
#[test]
fn wgpu_drafter_hidden_matches_the_host_drafter() {
    for (target, assistant) in PAIRS {
        for form in ["hf", "mlx-4bit"] {
            let (model, drafter) = open_pair(target, assistant, form);
            let r = &load_refs(target, "reference")[2];
            let drafter_opt = Some(DraftModel(drafter.config().clone(), drafter.weights().clone()));
            let opts = WgpuOptions { max_ctx: 256, max_chunk: 16, drafter: drafter_opt, ..Default::default() };
            let Some(mut b) = wgpu_backend(&model, opts) else { return };
            let next = *b.prefill_prompt(&r.prompt, 16, Readback::Argmax).unwrap().argmax.last().unwrap();
            let h = model.cfg.text.hidden_size;
            let rows = b.draft_context().unwrap().last_hidden().unwrap();
            let hidden = rows[rows.len() - h..].to_vec();
            let pos = r.prompt.len();
            let host = drafter.draft_block(b.draft_context().unwrap(), next, &hidden, pos, 3).unwrap();
            for k in 1..=3 {
                let dev = b.draft(next, &hidden, pos, k).unwrap().unwrap();
                let want: Vec<u32> = host[..k].iter().map(|s| s.token).collect();
                assert_eq!(dev, want, "{target}/{form} k={k}: drafts");
                let got = b.draft_hidden().unwrap();
                let want = &host[k - 1].hidden;
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let err = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                assert!(err <= 1e-4, "{target}/{form} step {k}: hidden differs by {err:e} of its largest value");
                eprintln!("wgpu {target}+{assistant} {form} step {k}: hidden within {err:.1e} of the host's");
            }
        }
    }
}

/// 20 rounds of k = 3 after the long prompt: `Backend::draft` (the device drafter, fed the hidden
/// row the host read back) equals `Drafter::draft_block` on the same K/V, every round.
fn check_device_drafts(tag: &str, make: MakeDrafting) {
    for (target, assistant) in PAIRS {
        for (form, reference) in FORMS {
            let (model, drafter) = open_pair(target, assistant, form);
            let r = &load_refs(target, reference)[2];
            let Some(mut b) = make(&model, &drafter) else { return };
            let h = model.cfg.text.hidden_size;
            let mut next = *b.prefill_prompt(&r.prompt, 16, Readback::Argmax).unwrap().argmax.last().unwrap();
            let mut pos = r.prompt.len();
            let mut hidden = b.draft_context().unwrap().last_hidden().unwrap()[..].to_vec();
            hidden = hidden[hidden.len() - h..].to_vec();
            let mut accepted = 0;
            for round in 0..20 {
                let dev = b.draft(next, &hidden, pos, 3).unwrap().expect("a device drafter");
                let host: Vec<u32> = drafter
                    .draft_block(b.draft_context().unwrap(), next, &hidden, pos, 3)
                    .unwrap()
                    .into_iter()
                    .map(|s| s.token)
                    .collect();
                assert_eq!(
                    dev, host,
                    "{tag} {target}+{assistant} {form} round {round}: device drafts differ from the host's"
                );
                let mut tokens = vec![next];
                tokens.extend_from_slice(&dev);
                let v = b.verify(&tokens, pos, false).unwrap();
                let n = dev.iter().zip(&v.argmax).take_while(|(d, t)| d == t).count();
                b.commit(n + 1).unwrap();
                let rows = b.draft_context().unwrap().last_hidden().unwrap();
                hidden = rows[n * h..(n + 1) * h].to_vec();
                next = v.argmax[n];
                pos += n + 1;
                accepted += n;
            }
            if target == "tiny-moe" {
                // Rounds after an accepted draft feed the hidden row of that draft (row n > 0).
                assert!(accepted > 0, "{target}+{assistant} {form}: no draft accepted in 20 rounds");
            }
            eprintln!("{tag} {target}+{assistant} {form}: 20 rounds, device drafts = host drafts, {accepted} accepted");
        }
    }
}

fn msl_emu(m: &Model) -> Box<dyn Backend> {
    Box::new(
        MetalBackend::emulated(m.cfg.clone(), m.weights.clone(), MetalOptions { max_ctx: 256, ..Default::default() })
            .expect("the msl-emu backend builds (it needs clang++)"),
    )
}

/// Speculative == greedy on the Metal kernels (through the MSL emulator), both pairs, both
/// forms, the long prompt and 64 new tokens (the 16-token window crossed several times), k = 1
/// and 3 drafting on the host, k = 2 with the device drafter; the copy drafter of tiny-moe must
/// get drafts accepted, so the accept path runs.
#[test]
fn msl_emu_speculative_equals_greedy() {
    for (target, assistant) in PAIRS {
        for (form, reference) in FORMS {
            let (model, drafter) = open_pair(target, assistant, form);
            let r = &load_refs(target, reference)[2];
            let p = GenerateParams { max_new: 64, ..params(model.stop_ids.clone(), true) };
            let want = greedy_on(msl_emu(&model).as_mut(), &r.prompt, &p);
            assert_eq!(want[..48], r.generated[..], "msl-emu {target}/{form}: greedy differs from {reference}");
            for (k, device) in [(1, false), (3, false), (2, true)] {
                let mut b = if device { msl_emu_drafting(&model, &drafter) } else { msl_emu(&model) };
                let (got, st) = speculative_on(b.as_mut(), &drafter, k, &r.prompt, &p);
                let how = if device { "device drafter" } else { "host drafter" };
                assert_eq!(got, want, "msl-emu {target}/{form} k={k} ({how}): speculative output differs from greedy");
                let accepted: usize = st.accepted.iter().sum();
                let drafted_out = st.from_draft.iter().filter(|&&d| d).count();
                assert_eq!(
                    drafted_out, accepted,
                    "msl-emu {target}/{form} k={k}: accepted drafts vs tokens from drafts"
                );
                if target == "tiny-moe" {
                    assert!(accepted > 0, "msl-emu {target}/{form} k={k}: no draft accepted ({st:?})");
                    assert!(st.target_passes < got.len(), "msl-emu {target}/{form} k={k}: a pass per token");
                }
                eprintln!("msl-emu {target}+{assistant} {form} k={k} ({how}): 64 tokens equal greedy; {accepted} drafts accepted, {:.2} tokens/pass", st.tokens_per_pass());
            }
        }
    }
}

/// The accept path on a dense target: the dense pair's random drafter gets nothing accepted, so
/// here the drafts are greedy's own next tokens, the last of every other round made wrong:
/// verify, accept the matching prefix, commit, continue — 64 tokens across the 16-token window,
/// which must be greedy's, with drafts accepted in every round.
#[test]
fn msl_emu_accepted_drafts_keep_greedy_output() {
    let (target, _) = PAIRS[1];
    let model = open_model(target, "mlx-4bit");
    let r = &load_refs(target, "dequant4bit_reference")[2];
    let p = GenerateParams { max_new: 64, ..params(model.stop_ids.clone(), true) };
    let want = greedy_on(msl_emu(&model).as_mut(), &r.prompt, &p);
    let mut b = msl_emu(&model);
    let vocab = model.cfg.text.vocab_size as u32;
    let mut next = b.prefill(&r.prompt, 0, Readback::Argmax).unwrap().argmax[0];
    let mut pos = r.prompt.len();
    let mut got = vec![next];
    let (mut round, mut accepted_total) = (0, 0);
    while got.len() < want.len() {
        let k = 3.min(want.len() - got.len());
        let mut drafts: Vec<u32> = want[got.len()..got.len() + k].to_vec();
        if round % 2 == 1 {
            *drafts.last_mut().unwrap() = (drafts[k - 1] + 1) % vocab;
        }
        let mut tokens = vec![next];
        tokens.extend_from_slice(&drafts);
        let v = b.verify(&tokens, pos, false).unwrap();
        let n = drafts.iter().zip(&v.argmax).take_while(|(d, t)| d == t).count();
        assert_eq!(n, if round % 2 == 1 { k - 1 } else { k }, "round {round}: accepted drafts");
        b.commit(n + 1).unwrap();
        got.extend_from_slice(&drafts[..n]);
        next = v.argmax[n];
        if got.len() < want.len() {
            got.push(next);
        }
        pos += n + 1;
        accepted_total += n;
        round += 1;
    }
    assert_eq!(got, want, "msl-emu {target}: verify/commit with accepted drafts differs from greedy");
    eprintln!("msl-emu {target}: {} tokens in {round} verify passes, {accepted_total} drafts accepted", got.len());
}

/// The same with every norm its own dispatch: residual norms (the decode path of hidden sizes
/// past PRO_MAX_HIDDEN (E4B, 26B), which the fixtures' small hidden sizes would otherwise never
/// run) and the KV-sharing layers' q norm (head_norm_rope, not inside attention_split). The
/// program must name no fused-norm kernel, where the default build of every pair's target has
/// some (else this would repeat wgpu_verify_logits_are_bitwise_sequential_decode).
#[test]
fn wgpu_unfused_verify_logits_are_bitwise_sequential_decode() {
    check_verify_bitwise("wgpu-unfused", &|m| {
        let opts = WgpuOptions { max_ctx: 256, max_chunk: 16, ..Default::default() };
        let b = wgpu_backend(
            m,
            WgpuOptions {
                tuning: Tuning { fuse_norms_up_to: 0, fold_q_norm: false, ..Tuning::default() },
                ..opts.clone()
            },
        )?;
        let d = wgpu_backend(m, opts).unwrap();
        assert!(fused_norm_labels(&d.program_listing()) > 0, "{}: the default build fuses no norm", m.source);
        assert_eq!(fused_norm_labels(&b.program_listing()), 0, "{}: fused norms left", m.source);
        Some(Box::new(b) as Box<dyn Backend>)
    });
}

/// The same across the bound between attention_short's rows and attention_split's: at 42 keys
/// the verify step's five rows (41–45 keys, after the 40-token prompt) straddle it, so it runs
/// both forms, each on its own rows, and every row is still bitwise the decode step's. The bound
/// must be where it is asked for: a decode step at position 41 (42 keys) runs attention_short
/// alone, as one at 0 does, and one at 42 the split form's extra dispatch.
#[test]
fn wgpu_verify_across_the_short_attention_bound_is_bitwise_sequential_decode() {
    check_verify_bitwise("wgpu-short-bound", &|m| {
        let b = wgpu_backend(
            m,
            WgpuOptions {
                max_ctx: 256,
                max_chunk: 16,
                tuning: Tuning { attn_short: 42, ..Tuning::default() },
                ..Default::default()
            },
        )?;
        assert_eq!(b.decode_dispatches(41), b.decode_dispatches(0), "{}: split below the bound", m.source);
        assert!(b.decode_dispatches(42) > b.decode_dispatches(41), "{}: no split past the bound", m.source);
        Some(Box::new(b) as Box<dyn Backend>)
    });
}

/// On the GPU (lavapipe in CI): speculative == greedy on the same backend, both pairs, the long
/// prompt (40 tokens, then 64 new: the 16-token window is crossed several times).
#[test]
fn wgpu_speculative_equals_greedy() {
    for (target, assistant) in PAIRS {
        for form in ["hf", "mlx-4bit"] {
            let (model, drafter) = open_pair(target, assistant, form);
            let r = &load_refs(target, "reference")[2];
            let p = GenerateParams { max_new: 64, ..params(model.stop_ids.clone(), true) };
            let make = || wgpu_backend(&model, WgpuOptions { max_ctx: 256, max_chunk: 16, ..Default::default() });
            let Some(mut g) = make() else { return };
            let want = greedy_on(&mut g, &r.prompt, &p);
            // Host drafter (drafts read back, then verify) and the device drafter (draft_verify:
            // drafts and verify in one submission).
            let runs: &[(usize, bool)] =
                if form == "hf" { &[(1, false), (3, false), (1, true), (3, true)] } else { &[(2, false), (2, true)] };
            for &(k, device) in runs {
                let mut b: Box<dyn Backend> =
                    if device { wgpu_drafting(&model, &drafter).unwrap() } else { Box::new(make().unwrap()) };
                let (got, st) = speculative_on(b.as_mut(), &drafter, k, &r.prompt, &p);
                let how = if device { "device drafter" } else { "host drafter" };
                assert_eq!(got, want, "wgpu {target}/{form} k={k} ({how}): speculative output differs from greedy");
                eprintln!("wgpu {target}+{assistant} {form} k={k} ({how}): 64 tokens equal greedy; {:.2} tokens/pass, acceptance {:?}", st.tokens_per_pass(), st.acceptance());
                let accepted: usize = st.accepted.iter().sum();
                let drafted_out = st.from_draft.iter().filter(|&&d| d).count();
                assert_eq!(drafted_out, accepted, "wgpu {target}/{form} k={k}: accepted drafts vs tokens from drafts");
                // Output equal to greedy holds even if every draft were rejected (then each round
                // emits the target's own token), so the equality alone says nothing about the
                // accept path on the GPU's verify rows. The copy drafter gets drafts accepted on
                // this prompt (transformers' assisted run accepts 18 of its 48 tokens): at least
                // one must be, and then fewer target passes than tokens are needed. The random
                // tiny-e2b-assistant accepts essentially none, so nothing is asserted for it.
                if target == "tiny-moe" {
                    assert!(accepted > 0, "wgpu {target}/{form} k={k}: no draft accepted ({st:?})");
                    assert!(st.target_passes < got.len(), "wgpu {target}/{form} k={k}: a pass per token");
                }
            }
        }
    }
}

/// `Backend::speculate` on wgpu: rounds run one ahead of the host, the GPU accepting each round
/// (spec_accept/spec_rows) before the host reads it. Twenty rounds of k = 3 with the copy drafter
/// (drafts accepted: the commit of accepted rows, the hidden row n > 0 and the positions all take
/// the GPU's path) hand out greedy's tokens, and greedy decode continued from where they stop
/// gives greedy's next tokens (the cache holds exactly the accepted positions, committed by the
/// round run past the last one). A context with room for only a few rounds ahead stops them
/// early, the last round committed by the host, and decode continues as greedy too. And the
/// same across the bound between the two decode attention forms.
#[test]
fn wgpu_rounds_run_ahead_on_the_device() {
    let (target, assistant) = PAIRS[0];
    let (model, drafter) = open_pair(target, assistant, "mlx-4bit");
    let r = &load_refs(target, "reference")[2];
    let p = GenerateParams { max_new: 96, ..params(model.stop_ids.clone(), true) };
    let want = greedy(&model, &r.prompt, &p);
    // The third run moves the decode attention's short/split bound (rows of at most 50 keys go
    // to attention_short) into the rounds: a round run ahead whose position the host does not
    // know may straddle it, and must dispatch both owners.
    for (max_ctx, rounds_wanted, short) in [(256, 20, None), (r.prompt.len() + 24, 20, None), (256, 20, Some(50))] {
        let mut tuning = Tuning::default();
        if let Some(s) = short {
            tuning.attn_short = s;
        }
        let opts = WgpuOptions {
            max_ctx,
            max_chunk: 16,
            tuning,
            drafter: Some(DraftModel(drafter.config().clone(), drafter.weights().clone())),
            ..Default::default()
        };
        let Some(mut b) = wgpu_backend(&model, opts.clone()) else { return };
        let mut next = *b.prefill_prompt(&r.prompt, 16, Readback::Argmax).unwrap().argmax.last().unwrap();
        let first = next;
        let mut got = vec![next];
        let mut pos = r.prompt.len();
        let (mut rounds, mut accepted) = (0, 0);
        let mut drafted: Vec<Vec<u32>> = Vec::new();
        let ran = b
            .speculate(next, pos, 3, &mut |drafts, argmax| {
                drafted.push(drafts.to_vec());
                let n = drafts.iter().zip(argmax).take_while(|(d, t)| d == t).count();
                got.extend_from_slice(&drafts[..n]);
                got.push(argmax[n]);
                (next, pos) = (argmax[n], pos + n + 1);
                (rounds, accepted) = (rounds + 1, accepted + n);
                Ok(rounds < rounds_wanted)
            })
            .unwrap()
            .expect("wgpu runs rounds on the device when built with a drafter");
        assert_eq!(ran, rounds, "ctx {max_ctx}: rounds reported");
        if max_ctx == 256 {
            assert_eq!(rounds, rounds_wanted, "ctx {max_ctx}: rounds stopped early");
            if short.is_some() {
                assert!(r.prompt.len() < 50 && pos > 50, "the rounds did not cross the short/split bound");
            }
            assert!(accepted > 0, "ctx {max_ctx}: no draft accepted in {rounds} rounds");
        } else {
            assert!(rounds < rounds_wanted, "ctx {max_ctx}: rounds ran past the room they had");
        }
        assert_eq!(got[..], want[..got.len()], "ctx {max_ctx}: tokens of the rounds differ from greedy");
        // The drafts themselves (which only decide acceptance, so greedy's tokens above cannot
        // show a wrong one) equal the host-driven rounds' (`draft_verify`: positions known,
        // tested against the host drafter), round for round.
        let mut h = wgpu_backend(&model, opts).unwrap();
        h.prefill_prompt(&r.prompt, 16, Readback::Argmax).unwrap();
        let (mut t, mut q) = (first, r.prompt.len());
        for (i, want_drafts) in drafted.iter().enumerate() {
            let (d, v) = h.draft_verify(t, q, 3).unwrap().unwrap();
            assert_eq!(&d, want_drafts, "ctx {max_ctx} round {i}: run-ahead drafts differ from host-driven ones");
            let n = d.iter().zip(&v.argmax).take_while(|(d, t)| d == t).count();
            h.commit(n + 1).unwrap();
            (t, q) = (v.argmax[n], q + n + 1);
        }
        // Greedy decode on from where the rounds stopped: the committed cache must be greedy's.
        let more = (max_ctx - pos).min(8);
        for i in 0..more {
            next = b.decode(next, pos + i, Readback::Argmax).unwrap().argmax[0];
            got.push(next);
        }
        assert_eq!(got[..], want[..got.len()], "ctx {max_ctx}: decode after the rounds differs from greedy");
        eprintln!("wgpu ctx {max_ctx}: {rounds} rounds on the device, {accepted} drafts accepted, then {more} decode steps: greedy's tokens");
    }
}

fn prefill(b: &mut dyn Backend, prompt: &[u32]) {
    for (i, piece) in prompt.chunks(16).enumerate() {
        b.prefill(piece, 16 * i, Readback::Argmax).unwrap();
    }
}

/// A verify of M = 2, 3 and 5 tokens after a prompt gives, row for row, the bits of M
/// sequential decode steps (lossless speculation needs the target's argmax exactly), and a
/// decode after committing 2 of the 5 rows continues as the sequential run did.
fn check_verify_bitwise(tag: &str, make: &dyn Fn(&Model) -> Option<Box<dyn Backend>>) {
    check_verify_bitwise_on(&PAIRS, tag, make)
}

/// `check_verify_bitwise` on the targets of `pairs` only.
fn check_verify_bitwise_on(pairs: &[(&str, &str)], tag: &str, make: &dyn Fn(&Model) -> Option<Box<dyn Backend>>) {
    for &(target, _) in pairs {
        for form in ["hf", "mlx-4bit"] {
            let model = open_model(target, form);
            let r = &load_refs(target, "reference")[2];
            let block: Vec<u32> = r.generated[..5].to_vec();
            let pos = r.prompt.len();
            let Some(mut seq) = make(&model) else { return };
            prefill(seq.as_mut(), &r.prompt);
            let mut want = Vec::new();
            for (i, &t) in block.iter().enumerate() {
                want.extend(seq.decode(t, pos + i, Readback::LastLogits).unwrap().logits);
            }
            let vocab = model.cfg.text.vocab_size;
            let mut ver = make(&model).unwrap();
            prefill(ver.as_mut(), &r.prompt);
            // M = 2 and 3 run token tiles of their size where a verify kernel has them, M = 5
            // two tiles of the widest (the second partly clamped): every row must be decode's.
            // A verify stages its rows without committing them, so each starts at `pos`.
            for m in [2, 3, 5] {
                let got = ver.verify(&block[..m], pos, true).unwrap();
                let d = max_abs_diff(&got.logits, &want[..m * vocab]);
                assert!(
                    got.logits.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{tag} {target}/{form}: verify (M = {m}) vs sequential max |Δlogit| = {d}"
                );
                eprintln!("{tag} {target}/{form}: verify (M = {m}) vs {m} sequential decodes: max |Δlogit| = {d} (bitwise equal)");
            }
            // Keep 2 of the 5 rows; the next decode must match the sequential run's 3rd row.
            ver.commit(2).unwrap();
            let next = ver.decode(block[2], pos + 2, Readback::LastLogits).unwrap().logits;
            assert!(
                next.iter().zip(&want[2 * vocab..3 * vocab]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{tag} {target}/{form}: decode after commit(2) differs"
            );
        }
    }
}
