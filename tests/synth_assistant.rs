//! `kestrel synth --arch {e2b,e4b,26b-a4b}-assistant`: synthetic MTP drafters of the published
//! shapes load through `Model::open`, make a `Drafter`, fit the synthetic target of the same
//! architecture (and not another one), and draft finite logits.
//!
//! The drafters are written with every published size except the vocabulary, cut to 4096 in
//! drafter and target alike (2 tokens per centroid cluster): the 262144-row embedding is most
//! of a checkpoint's bytes and exercises nothing the small one does not. One E2B drafter is
//! written at full size (4-bit, about 45 MB) to check the real token_ordering and shapes.

use std::path::{Path, PathBuf};

use kestrel::config::{AttnKind, Config, KvSource};
use kestrel::loader::Matrix;
use kestrel::model::Model;
use kestrel::spec::{DraftKv, Drafter, KvRows, StepInput};
use kestrel::synth::{preset, write_model, SplitMix64, SynthOptions, ARCHS};
use serde_json::json;

const SMALL_VOCAB: usize = 4096;

/// The config of the synthetic target `arch` (no weights needed: `check_target` reads configs).
fn target_config(arch: &str, vocab: Option<usize>) -> Config {
    let mut t = preset(arch).unwrap();
    t["model_type"] = json!("gemma4_text");
    if let Some(v) = vocab {
        t["vocab_size"] = json!(v);
        if t.get("vocab_size_per_layer_input").is_some() {
            t["vocab_size_per_layer_input"] = json!(v);
        }
    }
    Config::from_json_str(&t.to_string(), Path::new("synthetic-target/config.json")).unwrap()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kestrel-synth-assistant-{}-{label}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Writes drafter `arch` (vocabulary cut to `vocab` when given) and opens it.
fn write_and_open(arch: &str, vocab: Option<usize>, bits: Option<u32>, dir: &TempDir) -> Model {
    let mut cfg = preset(arch).unwrap();
    if let Some(v) = vocab {
        cfg["text_config"]["vocab_size"] = json!(v);
    }
    write_model(&dir.0, &cfg, &SynthOptions { bits, group_size: 64, seed: 11 }).unwrap();
    Model::open(&dir.0).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// The drafter's layers attend to the target's producer layers: same kinds as the published
/// drafters ([S, S, S, F]), all KV-shared, with the producer's head dim and kv head count.
fn check_layers(drafter: &Config, target: &Config, arch: &str) {
    let kinds: Vec<AttnKind> = drafter.layers.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [AttnKind::Sliding, AttnKind::Sliding, AttnKind::Sliding, AttnKind::Full], "{arch}");
    for l in &drafter.layers {
        let p = target.producer(l.kind).unwrap();
        assert!(matches!(l.kv, KvSource::Shared { .. }), "{arch}: layer {} owns a cache", l.index);
        let pl = &target.layers[p];
        assert_eq!((l.n_kv_heads, l.head_dim), (pl.n_kv_heads, pl.head_dim), "{arch}: layer {} vs target {p}", l.index);
    }
}

/// Random target K/V for `len` positions, shaped like `target`'s producer layer of `kind`.
fn random_kv(target: &Config, kind: AttnKind, len: usize, rng: &mut SplitMix64) -> KvRows {
    let pl = &target.layers[target.producer(kind).unwrap()];
    let n = len * pl.n_kv_heads * pl.head_dim;
    let mut draw = || (0..n).map(|_| rng.uniform()).collect::<Vec<f32>>();
    KvRows { start: 0, k: draw(), v: draw(), n_kv_heads: pl.n_kv_heads, head_dim: pl.head_dim }
}

/// Two chained draft steps on random target inputs: finite logits and hiddens, a draft token
/// that is the argmax, and (centroid head) exactly `top_k · vocab / num_centroids` scored tokens,
/// which only a token_ordering without repeats gives.
fn check_steps(d: &Drafter, target: &Config, arch: &str) {
    let mut rng = SplitMix64(5);
    let hb = d.backbone_hidden();
    let vocab = d.config().text.vocab_size;
    let position = 40;
    let kv = DraftKv {
        sliding: random_kv(target, AttnKind::Sliding, 20, &mut rng),
        full: random_kv(target, AttnKind::Full, position, &mut rng),
    };
    // The target's scaled embedding has elements of std ≈ 4 (embeddings of std 4/√H, times √H).
    let embedding: Vec<f32> = (0..hb).map(|_| 4.0 * rng.uniform()).collect();
    let mut hidden: Vec<f32> = (0..hb).map(|_| rng.uniform()).collect();
    for step in 0..2 {
        let s = d.step(&StepInput { embedding: &embedding, hidden: &hidden, position, kv: &kv }).unwrap();
        let label = format!("{arch} step {step}");
        assert_eq!((s.logits.len(), s.hidden.len()), (vocab, hb), "{label}");
        assert!(s.logits.iter().chain(&s.hidden).all(|v| v.is_finite()), "{label}: non-finite output");
        let span = |v: &mut dyn Iterator<Item = f32>| {
            v.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)))
        };
        let (fill, hi) = span(&mut s.logits.iter().copied());
        assert_eq!(s.logits[s.token as usize], hi, "{label}: draft token is not the argmax");
        // Unscored tokens of the centroid head hold the fill, `min(scored) − 1`: the lowest value.
        let ordered = d.config().assistant.as_ref().filter(|a| a.use_ordered_embeddings);
        let scored: Vec<f32> = s.logits.iter().copied().filter(|&v| ordered.is_none() || v > fill).collect();
        if let Some(a) = ordered {
            assert_eq!(scored.len(), a.centroid_intermediate_top_k * vocab / a.num_centroids, "{label}: scored tokens");
        }
        // Logits of std ≈ 4 (normed hidden against embeddings of std 4/√hidden): not all alike.
        let (lo, hi) = span(&mut scored.iter().copied());
        assert!(hi - lo > 1.0, "{label}: scored logits span only {lo}..{hi}");
        hidden = s.hidden;
    }
}

/// Every assistant preset, in bf16 and MLX 4/8-bit: loads, fits its own target, refuses another
/// architecture's target, and drafts.
#[test]
fn assistant_presets_load_fit_their_targets_and_draft() {
    let cases: [(&str, &str, Option<u32>); 4] =
        [("e2b", "e4b", None), ("e2b", "26b-a4b", Some(4)), ("e4b", "e2b", Some(8)), ("26b-a4b", "e4b", Some(4))];
    for (target_arch, other, bits) in cases {
        let arch = format!("{target_arch}-assistant");
        let dir = TempDir::new(&format!("{arch}-{bits:?}"));
        let model = write_and_open(&arch, Some(SMALL_VOCAB), bits, &dir);
        let target = target_config(target_arch, Some(SMALL_VOCAB));
        check_layers(&model.cfg, &target, &arch);
        let w = &model.weights;
        assert_eq!(matches!(w.embed, Matrix::Quant { .. }), bits.is_some(), "{arch}: embed_tokens format");
        let aw = w.assistant.as_ref().unwrap();
        assert_eq!(matches!(aw.pre_projection, Matrix::Quant { .. }), bits.is_some(), "{arch}: pre_projection");
        let ordered = target_arch != "26b-a4b";
        assert_eq!((aw.centroids.is_some(), aw.token_ordering.is_some()), (ordered, ordered), "{arch}: head");

        let d = Drafter::from_model(&model).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(d.backbone_hidden(), target.text.hidden_size, "{arch}");
        d.check_target(&target).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let wrong = target_config(other, Some(SMALL_VOCAB));
        assert!(d.check_target(&wrong).is_err(), "{arch} accepted as a drafter of {other}");
        check_steps(&d, &target, &arch);
    }
}

/// The published sizes themselves (spec §1.3), read from the presets at full vocabulary.
#[test]
fn assistant_presets_have_the_published_shapes() {
    // (target, backbone, hidden, MLP width, heads, centroid head)
    let published = [
        ("e2b", 1536, 256, 2048, 4, true),
        ("e4b", 2560, 256, 2048, 4, true),
        ("26b-a4b", 2816, 1024, 8192, 16, false),
    ];
    for (target_arch, backbone, hidden, inter, heads, ordered) in published {
        let arch = format!("{target_arch}-assistant");
        let cfg = Config::from_json_str(&preset(&arch).unwrap().to_string(), Path::new("a/config.json")).unwrap();
        let (t, a) = (&cfg.text, cfg.assistant.as_ref().unwrap());
        assert_eq!(
            (a.backbone_hidden_size, t.hidden_size, t.intermediate_size, t.num_attention_heads, t.vocab_size),
            (backbone, hidden, inter, heads, 262144),
            "{arch}"
        );
        assert_eq!(
            (a.use_ordered_embeddings, a.num_centroids, a.centroid_intermediate_top_k, t.final_logit_softcapping),
            (ordered, 2048, 32, None),
            "{arch}"
        );
        check_layers(&cfg, &target_config(target_arch, None), &arch);
    }
}

/// One drafter at its real size (4-bit): the full 262144-token ordering is a permutation, the
/// drafter fits the full-size E2B target and drafts.
#[test]
fn full_size_e2b_assistant_4bit() {
    let dir = TempDir::new("e2b-full");
    let model = write_and_open("e2b-assistant", None, Some(4), &dir);
    let order = model.weights.assistant.as_ref().unwrap().token_ordering.as_ref().unwrap();
    let mut seen = vec![false; 262144];
    for &id in order {
        assert!(!std::mem::replace(&mut seen[id as usize], true), "token {id} twice in token_ordering");
    }
    assert_eq!(order.len(), 262144);
    let target = target_config("e2b", None);
    let d = Drafter::from_model(&model).unwrap();
    d.check_target(&target).unwrap();
    check_steps(&d, &target, "e2b-assistant (full size)");
}

#[test]
fn unknown_arch_lists_every_choice() {
    for bad in ["e3b", "e3b-assistant", "assistant"] {
        let msg = preset(bad).unwrap_err().to_string();
        assert!(msg.contains(&format!("`{bad}`")), "{msg}");
        for arch in ARCHS {
            assert!(msg.contains(arch), "{bad}: `{msg}` does not offer {arch}");
        }
    }
}
