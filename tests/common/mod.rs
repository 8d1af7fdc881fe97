//! Shared helpers for the integration tests: fixture paths, the transformers references, and
//! backend construction with the "no adapter" rule (skip loudly, or fail under
//! KESTREL_REQUIRE_GPU=1 as CI sets it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kestrel::backend::wgpu::{WgpuBackend, WgpuOptions};
use kestrel::loader::{SafetensorsFile, TensorStore};
use kestrel::model::Model;
use kestrel::quant::{self, DType};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Weight forms of each fixture and the reference that judges them.
pub const FORMS: [(&str, &str); 2] = [("hf", "reference"), ("mlx-4bit", "dequant4bit_reference")];

pub fn open_model(name: &str, form: &str) -> Model {
    let dir = fixtures().join(name).join(form);
    Model::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// One prompt's reference: prompt ids, generated ids, and the step logits it saved
/// (`steps[i]` is the generation step of `step_logits[i]`).
pub struct PromptRef {
    pub prompt: Vec<u32>,
    pub generated: Vec<u32>,
    pub steps: Vec<usize>,
    pub step_logits: Vec<Vec<f32>>,
    /// Logits of every prompt position (main reference only).
    pub prompt_logits: Option<Vec<Vec<f32>>>,
}

fn ids(store: &TensorStore, name: &str) -> Vec<u32> {
    let t = store.get(name).unwrap_or_else(|| panic!("reference lacks {name}"));
    assert_eq!(t.dtype(), DType::I64);
    t.bytes().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
}

fn rows(store: &TensorStore, name: &str) -> Option<Vec<Vec<f32>>> {
    let t = store.get(name)?;
    let v = quant::floats_to_f32(t.bytes(), t.dtype());
    let w = *t.shape().last().unwrap();
    Some(v.chunks(w).map(|c| c.to_vec()).collect())
}

pub fn load_refs(name: &str, reference: &str) -> Vec<PromptRef> {
    let dir = fixtures().join(name).join("ref");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{reference}.json"))).unwrap()).unwrap();
    let file = SafetensorsFile::open(&dir.join(format!("{reference}.safetensors"))).unwrap();
    let store = TensorStore::from_files(vec![file]);
    let n = json["prompts"].as_array().unwrap().len();
    (0..n)
        .map(|i| {
            let (steps, step_logits) = match rows(&store, &format!("p{i}.step_logits")) {
                Some(r) => ((0..r.len()).collect(), r),
                None => {
                    let s: Vec<usize> =
                        json["saved_steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                    (s, rows(&store, &format!("p{i}.step_logits_sel")).unwrap())
                }
            };
            PromptRef {
                prompt: ids(&store, &format!("p{i}.prompt_ids")),
                generated: ids(&store, &format!("p{i}.generated_ids")),
                steps,
                step_logits,
                prompt_logits: rows(&store, &format!("p{i}.prompt_logits")),
            }
        })
        .collect()
}

/// True when GPU tests must run (CI sets KESTREL_REQUIRE_GPU=1 after installing lavapipe).
pub fn gpu_required() -> bool {
    std::env::var("KESTREL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// A wgpu backend for `model`, or None (printed as skipped) when no adapter exists.
pub fn wgpu_backend(model: &Model, opts: WgpuOptions) -> Option<WgpuBackend> {
    match WgpuBackend::new(model.cfg.clone(), model.weights.clone(), opts) {
        Ok(b) => Some(b),
        Err(e) => {
            let msg = e.to_string();
            if msg.contains("no GPU adapter") && !gpu_required() {
                eprintln!("skipped: no adapter ({msg})");
                None
            } else {
                panic!("wgpu backend: {msg}");
            }
        }
    }
}

/// Largest |a − b| over two rows.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
