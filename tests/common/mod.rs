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

// Logit tolerances against the transformers references (tests/fixtures.rs, tests/experts.rs).
//
// What a tolerance must guarantee: greedy ids cannot flip. If every logit of a step is within
// `tol` of the reference's, the gap between the reference's top two moves by at most 2·tol, so
// `tol` must stay below half the smallest top-1/top-2 margin of every reference step: 1.311e-3
// (tiny-e4b `short`, step 12, on the dequantised 4-bit weights) and 1.892e-3 (tiny-moe-k8
// `chat`, step 24, on the bf16 weights) are the smallest (every reference now keeps all 48
// steps; `tolerances_leave_every_greedy_step_its_margin` in tests/fixtures.rs checks them all).
// Below that, the tighter the better: a bug that moves logits by less than the tolerance goes
// unseen.
//
// What the arithmetic allows. Both sides compute in f32 on identical weights (bf16, or the
// exact `scale·q + bias` values), so an honest difference is rounding alone, grown through the
// layers. How big f32 rounding gets on these nets shows in the oracle itself, which runs the
// same f32 model in different orders: its sdpa and eager attention differ by up to 7.0e-5,
// cached and uncached decoding by up to 5.7e-5 (reference.json), and rerunning the script on
// another CPU (AVX2 vs AVX-512 kernels) moves its logits by up to 5.1e-5. Kestrel's CPU backend
// sums its dot products in f64, so its distance to the reference is mostly the reference's own
// rounding; its wgpu kernels are f32 in yet other orders. Measured over every fixture, prompt,
// prompt row and step: max |Δlogit| ≤ 4.9e-5 on the CPU (either form) and ≤ 5.9e-5 with wgpu
// on lavapipe (HF forms), NMSE 9e-14 … 4e-12.
//
// The 4-bit decode mat-vecs on wgpu add one more rounding: the fused-norm and routed-expert
// mat-vecs (qmv_digits.wgsl, qmv_core.wgsl's dot32i) multiply the nibbles by x held as
// integers, X = round(x·2^k) per 32-value chunk with k set by the chunk's largest |x| (|X| <
// 2^22, at least 2^21 for the largest). Each element then carries up to half a unit of X,
// between 2^-23 and 2^-22 of the chunk's largest |x|, where f32 alone would round it to
// 2^-24 of its own value: a small element gets an error a few to tens of times its own f32
// rounding, independent from element to element, so it adds to the row's sum a noise of the
// order of the sum's own f32 rounding, not more. Measured, it roughly doubles the error: with
// wgpu on the 4-bit forms NMSE 6e-13 … 1.5e-11 (the CPU on the same weights: 9e-14 … 2.2e-12),
// max |Δlogit| 1.0e-4 on the decode steps and 1.41e-4 over every variant in tests/fixtures.rs
// (tiny-e4b, min_k_splits 4). The unfused and split-tensor variants, whose dense mat-vecs take
// the float loop, stay at 5.5e-5.
//
// Hence, per form:
// - HF (bf16 weights), both backends: 1.5e-4, twice the largest spread between two f32 orders
//   of the oracle itself (7.0e-5) and 2.5× the largest measured (5.9e-5); 6.3× below half the
//   smallest HF margin (9.46e-4).
// - MLX 4-bit: 3e-4, the HF tolerance doubled for the integer-digit rounding of x, 2.1× the
//   largest measured (1.41e-4); 2.2× below half the smallest 4-bit margin (6.55e-4).
// The previous single 1e-3 was above half the smallest margin of tiny-moe-k8 (both forms) and of
// tiny-e4b's 4-bit form, and 7-17× the measured errors: a CPU softcap of 30.003 in place of 30,
// which moves logits by up to 6.4e-4, passed it with every id equal; it fails here.

/// Logit tolerance of the HF (bf16-weight) forms; see the argument above.
pub const HF_LOGIT_TOL: f32 = 1.5e-4;
/// Logit tolerance of the MLX 4-bit forms (integer-digit x in the wgpu mat-vecs); see above.
pub const Q4_LOGIT_TOL: f32 = 3e-4;

/// The logit tolerance of weight form `form` (a `FORMS` entry).
pub fn logit_tol(form: &str) -> f32 {
    match form {
        "hf" => HF_LOGIT_TOL,
        "mlx-4bit" => Q4_LOGIT_TOL,
        _ => panic!("no logit tolerance argued for form {form}"),
    }
}

/// One prompt's reference: prompt ids, generated ids, the logits of every generation step
/// (`step_logits[i]`: the row that chose `generated[i]`) and of every prompt position.
pub struct PromptRef {
    pub prompt: Vec<u32>,
    pub generated: Vec<u32>,
    pub step_logits: Vec<Vec<f32>>,
    pub prompt_logits: Vec<Vec<f32>>,
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

/// The reference `reference` (`reference` or `dequant4bit_reference`) of fixture `name`. Both
/// hold every step's logits and every prompt row's (tools/oracle/make_fixtures.py); a file
/// without them fails here rather than letting a comparison skip the rows it lacks.
pub fn load_refs(name: &str, reference: &str) -> Vec<PromptRef> {
    let dir = fixtures().join(name).join("ref");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{reference}.json"))).unwrap()).unwrap();
    let file = SafetensorsFile::open(&dir.join(format!("{reference}.safetensors"))).unwrap();
    let store = TensorStore::from_files(vec![file]);
    let n = json["prompts"].as_array().unwrap().len();
    let need = |t: &str| {
        rows(&store, t).unwrap_or_else(|| {
            panic!("{name}/ref/{reference} lacks {t}: regenerate it with tools/oracle/make_fixtures.py")
        })
    };
    (0..n)
        .map(|i| {
            let r = PromptRef {
                prompt: ids(&store, &format!("p{i}.prompt_ids")),
                generated: ids(&store, &format!("p{i}.generated_ids")),
                step_logits: need(&format!("p{i}.step_logits")),
                prompt_logits: need(&format!("p{i}.prompt_logits")),
            };
            assert_eq!(r.step_logits.len(), r.generated.len(), "{name}/{reference} p{i}: a logits row per step");
            assert_eq!(r.prompt_logits.len(), r.prompt.len(), "{name}/{reference} p{i}: a logits row per prompt token");
            r
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

/// The kernel labels of a `WgpuBackend::program_listing()`: every `label#hash` it names (each
/// dispatch's own kernel, and its decode and verify variants and their smaller tiles).
pub fn kernel_labels(listing: &str) -> Vec<&str> {
    listing
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '=')
        .filter_map(|t| t.split_once('#').map(|(label, _)| label))
        .collect()
}

/// Kernel labels that compute a norm inside another kernel: a mat-vec with the residual norm
/// fused in (`…_norm128i`, `…_norm64`: `WgpuOptions::fuse_norms_up_to`) or an attention that
/// normalises q itself (`…_qnorm`: `WgpuOptions::fold_q_norm`).
pub fn fused_norm_labels(listing: &str) -> usize {
    kernel_labels(listing)
        .into_iter()
        .filter(|l| {
            l.contains("_qnorm")
                || l.match_indices("_norm").any(|(i, _)| l[i + 5..].starts_with(|c: char| c.is_ascii_digit()))
        })
        .count()
}

/// Distinct buffers a listing binds (`b<n>:<bytes>`, numbered by first use).
pub fn listed_buffers(listing: &str) -> usize {
    let mut ids: Vec<&str> = listing
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter_map(|t| t.strip_prefix('b')?.split_once(':').map(|(n, _)| n))
        .filter(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}
