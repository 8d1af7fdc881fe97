//! Shapes no fixture covers: synthetic random-weight models (odd head dims, GQA 3:1, a PLE width
//! that is not a multiple of 8, hidden sizes that leave some matrices bf16 in 4-bit form, tiny
//! windows, several prefill chunks), bf16 and MLX 4/8-bit, run on the wgpu backend, on the Metal
//! kernels through the MSL emulator, and on the CPU reference (itself checked against transformers in tests/fixtures.rs).
//!
//! Teacher-forced: both backends see the CPU's greedy ids, and every step's logits must agree
//! within 1e-3 (f32 on both sides, different summation orders; see tests/fixtures.rs). Argmax
//! must agree wherever the CPU's top-2 margin exceeds twice that tolerance (a closer race can
//! legitimately go either way).

mod common;

use kestrel::backend::cpu::CpuBackend;
use kestrel::backend::metal::{MetalBackend, MetalOptions};
use kestrel::backend::wgpu::WgpuOptions;
use kestrel::backend::{Backend, Readback};
use kestrel::model::Model;
use kestrel::synth::{write_model, SynthOptions};
use serde_json::json;

const TOL: f32 = 1e-3;

fn config(case: usize) -> serde_json::Value {
    let rope = json!({
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
    });
    match case {
        // E2B-like: MQA, PLE of width 12 (tail path), KV sharing, double-wide, window 5.
        0 => json!({
            "vocab_size": 320, "hidden_size": 72, "intermediate_size": 96, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24, "global_head_dim": 40,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 5, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
            "hidden_size_per_layer_input": 12, "vocab_size_per_layer_input": 320, "num_kv_shared_layers": 3,
            "use_double_wide_mlp": true, "max_position_embeddings": 512, "rope_parameters": rope,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true
        }),
        // E4B-like: GQA 6:2, no PLE, no sharing, window larger than the prompt, 64-multiple dims;
        // K-as-V on the full layer with its own KV head count (26B-style attention, dense MLP).
        1 => json!({
            "vocab_size": 256, "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 4,
            "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 32, "global_head_dim": 64,
            "attention_k_eq_v": true, "num_global_key_value_heads": 1,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 64, "final_logit_softcapping": null, "rms_norm_eps": 1e-6,
            "num_kv_shared_layers": 0, "max_position_embeddings": 256, "rope_parameters": rope,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true
        }),
        // MoE (26B-style): 6 experts, top-3, K-as-V full layer; HF fused gate_up in bf16, MLX
        // split experts and an 8-bit router in the quantised forms.
        3 => json!({
            "vocab_size": 320, "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1,
            "attention_k_eq_v": true, "head_dim": 32, "global_head_dim": 64,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 6, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
            "enable_moe_block": true, "num_experts": 6, "top_k_experts": 3, "moe_intermediate_size": 64,
            "max_position_embeddings": 256, "rope_parameters": rope,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true
        }),
        // Full attention only, window 1 on the (unused) sliding rope, KV sharing of full layers.
        _ => json!({
            "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"],
            "sliding_window": 1, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 384, "num_kv_shared_layers": 2,
            "max_position_embeddings": 128, "rope_parameters": rope,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true
        }),
    }
}

fn check(model: &Model, label: &str) {
    let Some(gpu) = common::wgpu_backend(
        model,
        WgpuOptions { max_ctx: 128, max_chunk: 16, max_binding: Some(1 << 12), ..Default::default() },
    ) else {
        return;
    };
    check_against_cpu(model, Box::new(gpu), label);
}

/// Teacher-forced comparison of `gpu` (any backend) with the CPU reference on `model`.
fn check_against_cpu(model: &Model, mut gpu: Box<dyn Backend>, label: &str) {
    let mut cpu = CpuBackend::new(model.cfg.clone(), model.weights.clone(), 128);
    let vocab = model.cfg.text.vocab_size;
    let prompt: Vec<u32> = (0..37u32).map(|i| (i * 7919 + 11) % vocab as u32).collect();
    let (mut worst, mut pos) = (0.0f32, 0);
    let (mut lc, mut lg) = (Vec::new(), Vec::new());
    for piece in prompt.chunks(16) {
        let a = cpu.prefill(piece, pos, Readback::AllLogits).unwrap();
        let b = gpu.prefill(piece, pos, Readback::AllLogits).unwrap();
        worst = worst.max(common::max_abs_diff(&a.logits, &b.logits));
        pos += piece.len();
        lc = a.logits[a.logits.len() - vocab..].to_vec();
        lg = b.logits[b.logits.len() - vocab..].to_vec();
    }
    for step in 0..24 {
        worst = worst.max(common::max_abs_diff(&lc, &lg));
        let mut sorted = lc.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let (ic, ig) = (kestrel::sampler::argmax(&lc), kestrel::sampler::argmax(&lg));
        if sorted[0] - sorted[1] > 2.0 * TOL {
            assert_eq!(ic, ig, "{label}: step {step} argmax differs (margin {})", sorted[0] - sorted[1]);
        }
        let a = cpu.decode(ic, pos, Readback::LastLogits).unwrap();
        let b = gpu.decode(ic, pos, Readback::LastLogits).unwrap();
        pos += 1;
        lc = a.logits;
        lg = b.logits;
    }
    assert!(worst <= TOL, "{label}: logits differ by {worst} > {TOL}");
    eprintln!("{label}: OK, max |Δlogit| = {worst:.2e}");
}

#[test]
fn random_shapes_wgpu_matches_cpu() {
    for case in 0..4 {
        for bits in [None, Some(4), Some(8)] {
            let dir = std::env::temp_dir().join(format!("kestrel-synth-{}-{case}-{bits:?}", std::process::id()));
            write_model(&dir, &config(case), &SynthOptions { bits, group_size: 64, seed: case as u64 }).unwrap();
            let model = Model::open(&dir).unwrap();
            check(&model, &format!("case {case} bits {bits:?}"));
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}

/// The Metal kernels, through the MSL emulator, on every random shape (odd head dims, MoE with
/// fused HF and split MLX experts): bf16 and MLX 4/8-bit, against the CPU.
#[test]
fn random_shapes_msl_emu_matches_cpu() {
    for case in 0..4 {
        for bits in [None, Some(4), Some(8)] {
            let dir = std::env::temp_dir().join(format!("kestrel-synth-msl-{}-{case}-{bits:?}", std::process::id()));
            write_model(&dir, &config(case), &SynthOptions { bits, group_size: 64, seed: case as u64 }).unwrap();
            let model = Model::open(&dir).unwrap();
            let emu = MetalBackend::emulated(
                model.cfg.clone(),
                model.weights.clone(),
                MetalOptions { max_ctx: 128, ..Default::default() },
            )
            .unwrap_or_else(|e| panic!("case {case}: msl-emu does not build: {e}"));
            check_against_cpu(&model, Box::new(emu), &format!("msl-emu case {case} bits {bits:?}"));
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}

/// A MoE model with more routed experts than the GPU router ranks (router_topk: one thread per
/// expert, 256) is refused by the wgpu backend with an error that says so and names the way out,
/// not run with a wrong top-k; the CPU reference runs it.
#[test]
fn too_many_experts_for_the_gpu_router_is_an_error() {
    let mut cfg = config(3);
    cfg["num_experts"] = json!(257);
    cfg["top_k_experts"] = json!(2);
    cfg["num_hidden_layers"] = json!(1);
    cfg["layer_types"] = json!(["sliding_attention"]);
    let dir = std::env::temp_dir().join(format!("kestrel-synth-257-experts-{}", std::process::id()));
    write_model(&dir, &cfg, &SynthOptions { bits: None, group_size: 64, seed: 7 }).unwrap();
    let model = Model::open(&dir).unwrap();
    let mut cpu = CpuBackend::new(model.cfg.clone(), model.weights.clone(), 16);
    assert_eq!(cpu.prefill(&[1, 2, 3], 0, Readback::LastLogits).unwrap().argmax.len(), 1, "the CPU reference runs it");
    match kestrel::backend::wgpu::WgpuBackend::new(
        model.cfg.clone(),
        model.weights.clone(),
        WgpuOptions { max_ctx: 16, max_chunk: 16, ..Default::default() },
    ) {
        Ok(_) => panic!("257 experts accepted by the wgpu backend"),
        Err(e) => {
            let msg = e.to_string();
            if msg.contains("no GPU adapter") && !common::gpu_required() {
                eprintln!("skipped: no adapter ({msg})");
            } else {
                assert!(
                    msg.contains("257 experts") && msg.contains("at most 256") && msg.contains("--backend cpu"),
                    "{msg}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
