//! Snapshots of the greedy ids (and their text) each fixture model produces on each backend, so
//! that any change in what Kestrel generates shows up in review as a diff of `snapshots/*.snap`.
//!
//! Before a snapshot is checked, the backends are checked against each other and against
//! transformers: cpu, msl-emu and wgpu must give the same ids for the same model (one snapshot
//! per model and form, shared by every backend), and those ids must be
//! the first 32 of the fixture reference for the 'chat' prompt (reference prompt 0). So a snapshot
//! only ever records output that is already known to be right.
//!
//! Create or update with `INSTA_UPDATE=always cargo test --test snapshots`; CI runs with
//! `INSTA_UPDATE=no`.

mod common;

use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::metal::{MetalBackend, MetalOptions};
use kestrel::backend::wgpu::WgpuOptions;
use kestrel::backend::Backend;
use kestrel::engine::{self, GenerateParams};
use kestrel::model::Model;
use kestrel::sampler::{Sampler, SamplerConfig};

const NEW: usize = 32;
const CTX: usize = 256;

fn chat_prompt() -> Vec<u32> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("prompts.json")).unwrap()).unwrap();
    let p = v.as_array().unwrap().iter().find(|p| p["name"] == "chat").expect("prompts.json has 'chat'");
    p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy, EOS ignored, `NEW` tokens.
fn generate(b: &mut dyn Backend, prompt: &[u32], model: &Model) -> Vec<u32> {
    let params = GenerateParams { max_new: NEW, stop_ids: model.stop_ids.clone(), ignore_eos: true, chunk: 128 };
    let mut sampler = Sampler::new(SamplerConfig::default());
    let (ids, stats) = engine::generate(b, prompt, &params, &mut sampler, |_| Ok(())).unwrap();
    assert_eq!(stats.generated_tokens, NEW);
    ids
}

fn snapshot(name: &str, model: &Model, ids: &[u32]) {
    let tok = model.tokenizer.as_ref().expect("fixture has a tokenizer");
    let text = tok.decode(ids, true).unwrap();
    let body = format!("ids: {ids:?}\ntext: {text:?}\n");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(format!("{} greedy ids for the 'chat' fixture prompt, EOS ignored", NEW));
    settings.bind(|| insta::assert_snapshot!(name, body));
}

/// Runs `model` on every backend that can run it here — cpu, msl-emu (the Metal kernels on the
/// CPU) and, where an adapter exists, wgpu — checks each against `expected`, and records ONE
/// snapshot, `label`, that they all match: a backend cannot drift from the others and keep a
/// snapshot of its own.
fn check(model: &Model, label: &str, expected: &[u32]) {
    let prompt = chat_prompt();
    let mut cpu = CpuBackend::new(model.cfg.clone(), model.weights.clone(), CTX);
    let cpu_ids = generate(&mut cpu, &prompt, model);
    assert_eq!(cpu_ids, expected, "cpu {label}: ids differ from the transformers reference");
    let mut emu = MetalBackend::emulated(
        model.cfg.clone(),
        model.weights.clone(),
        MetalOptions { max_ctx: CTX, ..Default::default() },
    )
    .expect("the msl-emu backend builds (it needs clang++)");
    let emu_ids = generate(&mut emu, &prompt, model);
    assert_eq!(emu_ids, cpu_ids, "{label}: msl-emu and cpu ids differ");
    let wgpu_ids = common::wgpu_backend(
        model,
        WgpuOptions { max_ctx: CTX, max_chunk: 128, max_binding: None, ..Default::default() },
    )
    .map(|mut b| generate(&mut b, &prompt, model));
    if let Some(w) = &wgpu_ids {
        assert_eq!(w, &cpu_ids, "{label}: wgpu and cpu ids differ");
    }
    snapshot(label, model, &cpu_ids);
}

/// The first `NEW` ids transformers generated for the 'chat' prompt.
fn reference(name: &str, reference: &str) -> Vec<u32> {
    let refs = common::load_refs(name, reference);
    assert_eq!(refs[0].prompt, chat_prompt(), "{name}/{reference}: prompt 0 is the 'chat' prompt");
    refs[0].generated[..NEW].to_vec()
}

fn fixture(name: &str) {
    for (form, r) in common::FORMS {
        let model = common::open_model(name, form);
        check(&model, &format!("{name}__{form}"), &reference(name, r));
    }
}

#[test]
fn tiny_e2b() {
    fixture("tiny-e2b");
}

#[test]
fn tiny_e4b() {
    fixture("tiny-e4b");
}

#[test]
fn embedded_default() {
    let model = Model::embedded().unwrap();
    let name = model.source.strip_prefix("embedded:").unwrap().to_string();
    // The embedded model is the tiny-e2b fixture in MLX 4-bit form.
    check(&model, &format!("embedded__{name}"), &reference("tiny-e2b", "dequant4bit_reference"));
}

/// Greedy decode that stops early and resumes: the wgpu backend runs one step ahead of the host,
/// so when the host stops, a step past the last id has already written K/V at the next
/// position. Resuming there (as the next decode or chat turn does) must give the reference ids,
/// and so must a plain `decode` resumed after a second early stop.
#[test]
fn run_ahead_decode_stops_and_resumes() {
    let model = common::open_model("tiny-e2b", "mlx-4bit");
    let want = reference("tiny-e2b", "dequant4bit_reference");
    let Some(mut b) = common::wgpu_backend(
        &model,
        WgpuOptions { max_ctx: CTX, max_chunk: 128, max_binding: None, ..Default::default() },
    ) else {
        return;
    };
    let prompt = chat_prompt();
    let first = b.prefill(&prompt, 0, kestrel::backend::Readback::Argmax).unwrap().argmax[0];
    assert_eq!(first, want[0]);
    let mut got = vec![first];
    let mut pos = prompt.len();
    // Stop after 5 ids (a run-ahead step is in flight), resume, stop after 7 more, then
    // single decode steps, then run-ahead to the end.
    for stop_after in [5usize, 7] {
        let mut n = 0;
        let produced = b
            .decode_greedy(*got.last().unwrap(), pos, NEW, &mut |id| {
                got.push(id);
                n += 1;
                Ok(n < stop_after)
            })
            .unwrap();
        assert_eq!(produced, stop_after);
        pos += produced;
    }
    for _ in 0..3 {
        let id = b.decode(*got.last().unwrap(), pos, kestrel::backend::Readback::Argmax).unwrap().argmax[0];
        got.push(id);
        pos += 1;
    }
    let rest = NEW - got.len();
    let produced = b
        .decode_greedy(*got.last().unwrap(), pos, rest, &mut |id| {
            got.push(id);
            Ok(true)
        })
        .unwrap();
    assert_eq!(produced, rest);
    assert_eq!(got, want, "run-ahead greedy decode with stops differs from the transformers ids");
}
