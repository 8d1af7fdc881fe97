//! Synthetic Gemma 4 checkpoints (targets and their MTP drafters): a config plus random weights
//! of realistic magnitude, written as a real model directory (config.json + model.safetensors)
//! that the loader reads like any other. Used by tests (odd shapes no fixture covers) and, later,
//! by benchmarks that need full-size models without downloading weights.
//!
//! Magnitudes follow the fixture oracle: linear weights N(0, 1/fan_in) (drawn uniform with that
//! variance), embeddings (and a drafter's centroids) with std 4/√hidden (logits of std ≈ 4 before
//! the softcap), q/k norm weights U(0.3, 0.5) (Gemma 4's attention has scale 1.0), other norms
//! U(0.6, 1.4), layer scalars U(0.3, 1.0). Weights are generated and written one row at a time,
//! so memory stays bounded by one row whatever the model size. Quantised forms follow MLX: a
//! matrix is quantised when its input width is a multiple of the group size, and kept bf16
//! otherwise.

use std::os::unix::fs::FileExt;
use std::path::Path;

use half::bf16;
use serde_json::{json, Value};

use crate::config::{Config, KvSource};
use crate::error::{Error, Result};
use crate::quant;

/// Every `--arch` [`preset`] knows: the targets, then their MTP drafters.
pub const ARCHS: [&str; 6] = ["e2b", "e4b", "26b-a4b", "e2b-assistant", "e4b-assistant", "26b-a4b-assistant"];

fn unknown_arch(arch: &str) -> Error {
    let (last, rest) = ARCHS.split_last().expect("ARCHS is not empty");
    Error::Invalid(format!("unknown --arch `{arch}`: choose {} or {last}", rest.join(", ")))
}

/// The config of a real architecture, for full-size synthetic checkpoints: a target's text
/// config (spec §1.1; `e2b`, `e4b`, `26b-a4b`), or its drafter's `gemma4_assistant` config
/// (spec §1.3; the same names with `-assistant`). [`write_model`] takes either.
pub fn preset(arch: &str) -> Result<Value> {
    match arch.strip_suffix("-assistant") {
        Some(target) => assistant_preset(target).map_err(|_| unknown_arch(arch)),
        None => target_preset(arch),
    }
}

/// Text configs of the target models (spec §1.1).
fn target_preset(arch: &str) -> Result<Value> {
    let rope = json!({
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
    });
    let pattern = |n: usize, period: usize| -> Vec<&'static str> {
        (0..n).map(|i| if i % period == period - 1 { "full_attention" } else { "sliding_attention" }).collect()
    };
    let (hidden, inter, layers, kv, period, shared, double) = match arch {
        "e2b" => (1536, 6144, 35, 1, 5, 20, true),
        "e4b" => (2560, 10240, 42, 2, 6, 18, false),
        "26b-a4b" => {
            return Ok(json!({
                "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
                "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 2,
                "attention_k_eq_v": true, "head_dim": 256, "global_head_dim": 512,
                "layer_types": pattern(30, 6), "sliding_window": 1024, "final_logit_softcapping": 30.0,
                "rms_norm_eps": 1e-6, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
                "enable_moe_block": true, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
                "max_position_embeddings": 262144, "rope_parameters": rope,
                "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
                "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0
            }))
        }
        other => return Err(unknown_arch(other)),
    };
    Ok(json!({
        "vocab_size": 262144, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": 8, "num_key_value_heads": kv, "head_dim": 256, "global_head_dim": 512,
        "layer_types": pattern(layers, period), "sliding_window": 512, "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6, "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
        "num_kv_shared_layers": shared, "use_double_wide_mlp": double, "max_position_embeddings": 131072,
        "rope_parameters": rope, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
        "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0
    }))
}

/// The `gemma4_assistant` config of the drafter published for target `arch` (spec §1.3).
///
/// Only the drafter's own sizes are listed here. Everything through which it attends to the
/// target's K/V (kv head counts, head dims, K-as-V, rope, window) and the vocabulary are copied
/// from the target preset rather than restated, so a drafter always fits its synthetic target.
/// They agree with the published assistant configs: kv heads 1 (E2B), 2 (E4B), 8 / global 2
/// with K-as-V (26B-A4B); head dims 256 / 512; windows 512, 512, 1024.
fn assistant_preset(arch: &str) -> Result<Value> {
    // (drafter hidden, MLP width, query heads, centroid head). The 26B-A4B drafter's hidden,
    // width and heads come from test fixtures only (spec §1.3 marks them unverified); it has a
    // dense tied head where E2B/E4B score through 2048 token clusters (spec §3.3).
    let (hidden, inter, heads, ordered) = match arch {
        "e2b" | "e4b" => (256, 2048, 4, true),
        "26b-a4b" => (1024, 8192, 16, false),
        other => return Err(unknown_arch(other)),
    };
    let target = target_preset(arch)?;
    let mut text = json!({
        "model_type": "gemma4_text", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 4,
        "num_attention_heads": heads,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        // Every drafter layer reads the target's K/V; the drafter has no cache and no softcap.
        "num_kv_shared_layers": 4, "final_logit_softcapping": null,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "use_double_wide_mlp": false,
        "enable_moe_block": false, "tie_word_embeddings": true
    });
    for key in [
        "vocab_size",
        "num_key_value_heads",
        "num_global_key_value_heads",
        "attention_k_eq_v",
        "head_dim",
        "global_head_dim",
        "sliding_window",
        "rope_parameters",
        "rms_norm_eps",
        "hidden_activation",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ] {
        if let Some(v) = target.get(key) {
            text[key] = v.clone();
        }
    }
    Ok(json!({
        "model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"],
        "backbone_hidden_size": target["hidden_size"], "use_ordered_embeddings": ordered,
        "num_centroids": 2048, "centroid_intermediate_top_k": 32, "tie_word_embeddings": true,
        "text_config": text
    }))
}

/// What to write.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// `None`: bf16 weights (HF form). `Some(4 | 8)`: MLX affine quantisation.
    pub bits: Option<u32>,
    pub group_size: usize,
    pub seed: u64,
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy)]
enum Init {
    /// Uniform with variance 1/fan_in.
    Linear,
    /// Uniform with standard deviation `std`.
    Std(f32),
    /// Uniform in [lo, hi).
    Range(f32, f32),
}

struct Spec {
    /// Module path as stored (`model.layers.0.mlp.up_proj`; vectors with their `.weight`).
    name: String,
    /// Logical shape: `[rows, cols]` for matrices (experts stacked in rows), `[n]` for vectors.
    shape: Vec<usize>,
    init: Init,
    matrix: bool,
    /// Experts stacked in this matrix (stored as `[lead, rows / lead, cols]`); 1 otherwise.
    lead: usize,
    /// Quantisation bits overriding the model's (MLX puts the router at 8 bits).
    bits: Option<u32>,
    /// Stored under its own name, without `.weight` (HF's expert stacks).
    bare: bool,
}

/// splitmix64: tiny, seedable and good enough for weights (and for the tests' random inputs).
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), a multiple of 2^-23 (an exact f32).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Every float tensor of the checkpoint, in file order. The decoder lives under `model.` (the
/// bare `gemma4_text` and the assistant naming alike); a drafter's own projections and centroid
/// head sit at the top level (spec §4.1).
fn specs(cfg: &Config, quantised_experts: bool) -> Vec<Spec> {
    let t = &cfg.text;
    let h = t.hidden_size;
    let mut v = Vec::new();
    let top = |name: &str, rows: usize, cols: usize, init: Init| Spec {
        name: name.into(),
        shape: vec![rows, cols],
        init,
        matrix: true,
        lead: 1,
        bits: None,
        bare: false,
    };
    if let Some(a) = &cfg.assistant {
        let hb = a.backbone_hidden_size;
        v.push(top("pre_projection", h, 2 * hb, Init::Linear));
        v.push(top("post_projection", hb, h, Init::Linear));
        if a.use_ordered_embeddings {
            // Centroids live in embedding space: scaled like embed_tokens, so centroid scores
            // are of the size of logits.
            v.push(top("masked_embedding.centroids", a.num_centroids, h, Init::Std(4.0 / (h as f32).sqrt())));
        }
    }
    let mut mat = |name: String, rows: usize, cols: usize, init: Init| {
        v.push(Spec { name: format!("model.{name}"), ..top("", rows, cols, init) })
    };
    mat("embed_tokens".into(), t.vocab_size, h, Init::Std(4.0 / (h as f32).sqrt()));
    if cfg.has_ple() {
        let lp = t.num_hidden_layers * t.hidden_size_per_layer_input;
        mat(
            "embed_tokens_per_layer".into(),
            t.vocab_size,
            lp,
            Init::Std(1.0 / (t.hidden_size_per_layer_input as f32).sqrt()),
        );
        mat("per_layer_model_projection".into(), lp, h, Init::Linear);
    }
    for l in &cfg.layers {
        let p = format!("layers.{}.", l.index);
        mat(format!("{p}self_attn.q_proj"), l.q_dim(), h, Init::Linear);
        if let KvSource::Own { .. } = l.kv {
            mat(format!("{p}self_attn.k_proj"), l.kv_dim(), h, Init::Linear);
            if !l.k_eq_v {
                mat(format!("{p}self_attn.v_proj"), l.kv_dim(), h, Init::Linear);
            }
        }
        mat(format!("{p}self_attn.o_proj"), h, l.q_dim(), Init::Linear);
        mat(format!("{p}mlp.gate_proj"), l.mlp_width, h, Init::Linear);
        mat(format!("{p}mlp.up_proj"), l.mlp_width, h, Init::Linear);
        mat(format!("{p}mlp.down_proj"), h, l.mlp_width, Init::Linear);
        if cfg.has_ple() {
            let pd = t.hidden_size_per_layer_input;
            mat(format!("{p}per_layer_input_gate"), pd, h, Init::Linear);
            mat(format!("{p}per_layer_projection"), h, pd, Init::Linear);
        }
    }
    if t.enable_moe_block {
        let (e, iw) = (t.num_experts, t.moe_intermediate_size);
        for l in &cfg.layers {
            let p = format!("layers.{}.", l.index);
            v.push(Spec {
                name: format!("model.{p}router.proj"),
                shape: vec![e, h],
                init: Init::Linear,
                matrix: true,
                lead: 1,
                bits: Some(8),
                bare: false,
            });
            let expert = |name: String, out: usize, cols: usize, bare: bool| Spec {
                name: format!("model.{name}"),
                shape: vec![e * out, cols],
                init: Init::Linear,
                matrix: true,
                lead: e,
                bits: None,
                bare,
            };
            if quantised_experts {
                // MLX form: gate and up split, [E, out, in] each.
                v.push(expert(format!("{p}experts.switch_glu.gate_proj"), iw, h, false));
                v.push(expert(format!("{p}experts.switch_glu.up_proj"), iw, h, false));
                v.push(expert(format!("{p}experts.switch_glu.down_proj"), h, iw, false));
            } else {
                // HF form: gate and up fused along rows, no `.weight` suffix.
                v.push(expert(format!("{p}experts.gate_up_proj"), 2 * iw, h, true));
                v.push(expert(format!("{p}experts.down_proj"), h, iw, true));
            }
        }
    }
    let mut vec_ = |name: String, n: usize, init: Init| {
        v.push(Spec {
            name: format!("model.{name}"),
            shape: vec![n],
            init,
            matrix: false,
            lead: 1,
            bits: None,
            bare: false,
        })
    };
    let norm = Init::Range(0.6, 1.4);
    vec_("norm.weight".into(), h, norm);
    if cfg.has_ple() {
        vec_("per_layer_projection_norm.weight".into(), t.hidden_size_per_layer_input, norm);
    }
    for l in &cfg.layers {
        let p = format!("layers.{}.", l.index);
        for n in
            ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
        {
            vec_(format!("{p}{n}.weight"), h, norm);
        }
        vec_(format!("{p}layer_scalar"), 1, Init::Range(0.3, 1.0));
        vec_(format!("{p}self_attn.q_norm.weight"), l.head_dim, Init::Range(0.3, 0.5));
        if l.owns_kv() {
            vec_(format!("{p}self_attn.k_norm.weight"), l.head_dim, Init::Range(0.3, 0.5));
        }
        if cfg.has_ple() {
            vec_(format!("{p}post_per_layer_input_norm.weight"), h, norm);
        }
        if t.enable_moe_block {
            vec_(format!("{p}router.scale"), h, Init::Range(0.5, 1.5));
            vec_(format!("{p}router.per_expert_scale"), t.num_experts, Init::Range(0.5, 1.5));
            for n in ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"] {
                vec_(format!("{p}{n}.weight"), h, norm);
            }
        }
    }
    v
}

/// One stored tensor of the output file.
struct Stored {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: usize,
}

/// Writes a synthetic model for `config` into `dir`. `config` is either a text config (written
/// as `gemma4_text`): dense or MoE (MLX form: split experts and 8-bit routers; bf16: HF's fused
/// gate_up); or a `gemma4_assistant` config: an MTP drafter, with its projections, and for the
/// centroid head its centroids and a random `token_ordering` (a seeded permutation of the
/// vocabulary, int64 as transformers stores it).
pub fn write_model(dir: &Path, config: &Value, opts: &SynthOptions) -> Result<()> {
    let mut cfg_json = config.clone();
    let obj = cfg_json.as_object_mut().ok_or_else(|| Error::Invalid("config must be a JSON object".into()))?;
    let assistant = obj.get("model_type").and_then(|v| v.as_str()) == Some("gemma4_assistant");
    if !assistant {
        obj.insert("model_type".into(), json!("gemma4_text"));
    }
    let text = if assistant { obj.get("text_config").and_then(Value::as_object) } else { Some(&*obj) };
    let field = |key: &str| text.and_then(|t| t.get(key));
    let moe = field("enable_moe_block").and_then(Value::as_bool).unwrap_or(false);
    let n_layers = field("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0);
    if let Some(bits) = opts.bits {
        let mut q = json!({"group_size": opts.group_size, "bits": bits, "mode": "affine"});
        if moe {
            // mlx_lm's quant predicate: routers at 8 bits.
            for i in 0..n_layers {
                q[format!("model.layers.{i}.router.proj")] = json!({"group_size": opts.group_size, "bits": 8});
            }
        }
        obj.insert("quantization".into(), q.clone());
        obj.insert("quantization_config".into(), q);
    }
    let cfg = Config::from_json_str(&cfg_json.to_string(), &dir.join("config.json"))?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let specs = specs(&cfg, opts.bits.is_some());

    // Layout first (the header needs every offset), then the data in the same order.
    let quantised = |s: &Spec| s.matrix && opts.bits.is_some() && s.shape[1].is_multiple_of(opts.group_size);
    let spec_bits = |s: &Spec| s.bits.or(opts.bits).unwrap_or(16) as usize;
    // `[lead, rows / lead, last]`, or `[rows, last]` when nothing is stacked.
    let shape = |s: &Spec, rows: usize, last: usize| -> Vec<usize> {
        if s.lead > 1 {
            vec![s.lead, rows / s.lead, last]
        } else {
            vec![rows, last]
        }
    };
    let mut stored = Vec::new();
    for s in &specs {
        let (rows, cols) = if s.matrix { (s.shape[0], s.shape[1]) } else { (1, s.shape[0]) };
        if quantised(s) {
            let bits = spec_bits(s);
            stored.push(Stored {
                name: format!("{}.weight", s.name),
                dtype: "U32",
                shape: shape(s, rows, cols * bits / 32),
                bytes: rows * cols * bits / 8,
            });
            for part in ["scales", "biases"] {
                let g = cols / opts.group_size;
                stored.push(Stored {
                    name: format!("{}.{part}", s.name),
                    dtype: "BF16",
                    shape: shape(s, rows, g),
                    bytes: rows * g * 2,
                });
            }
        } else if s.matrix {
            let name = if s.bare { s.name.clone() } else { format!("{}.weight", s.name) };
            stored.push(Stored { name, dtype: "BF16", shape: shape(s, rows, cols), bytes: rows * cols * 2 });
        } else {
            stored.push(Stored { name: s.name.clone(), dtype: "BF16", shape: s.shape.clone(), bytes: rows * cols * 2 });
        }
    }
    // The centroid head's token ordering is ids, not weights: it is stored after every float tensor.
    let ordering = cfg.assistant.as_ref().filter(|a| a.use_ordered_embeddings).map(|_| cfg.text.vocab_size);
    if let Some(n) = ordering {
        stored.push(Stored {
            name: "masked_embedding.token_ordering".into(),
            dtype: "I64",
            shape: vec![n],
            bytes: n * 8,
        });
    }
    let mut header = serde_json::Map::new();
    let mut off = 0;
    for s in &stored {
        header
            .insert(s.name.clone(), json!({"dtype": s.dtype, "shape": s.shape, "data_offsets": [off, off + s.bytes]}));
        off += s.bytes;
    }
    let mut htext = Value::Object(header).to_string().into_bytes();
    htext.resize(htext.len().next_multiple_of(8), b' ');

    let path = dir.join("model.safetensors");
    let tmp = dir.join("model.safetensors.partial");
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let io = |e| Error::io(&tmp, e);
    let data_start = (8 + htext.len()) as u64;
    file.write_all_at(&(htext.len() as u64).to_le_bytes(), 0).map_err(io)?;
    file.write_all_at(&htext, 8).map_err(io)?;
    file.set_len(data_start + off as u64).map_err(io)?;

    // Every row is drawn from its own seed (tensor seed, row index), so rows are independent:
    // threads fill disjoint blocks of rows with positioned writes, and the file is the same
    // whatever the thread count. Memory: one block of rows per thread.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut master = SplitMix64(opts.seed ^ 0x6b65_7374_7265_6c00);
    let mut stored_iter = stored.iter().scan(0u64, |o, st| {
        let at = *o;
        *o += st.bytes as u64;
        Some(data_start + at)
    });
    for s in &specs {
        let (rows, cols) = if s.matrix { (s.shape[0], s.shape[1]) } else { (1, s.shape[0]) };
        let tensor_seed = master.next_u64();
        let init = s.init;
        let draw_row = move |r: usize, out: &mut Vec<f32>| {
            let mut rr = SplitMix64(tensor_seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            out.clear();
            out.extend((0..cols).map(|_| match init {
                Init::Linear => rr.uniform() * (3.0 / cols as f32).sqrt(),
                Init::Std(sd) => rr.uniform() * sd * 3f32.sqrt(),
                Init::Range(lo, hi) => lo + (rr.uniform() + 1.0) * 0.5 * (hi - lo),
            }));
        };
        let q = quantised(s);
        let bits = spec_bits(s);
        // Byte offsets of this tensor's stored parts (words, scales, biases; or the bf16 values).
        let offs: Vec<u64> =
            (0..if q { 3 } else { 1 }).map(|_| stored_iter.next().expect("one stored entry per part")).collect();
        let (wrow, grow) = (cols * bits / 8, 2 * (cols / opts.group_size.max(1)));
        // Blocks of at most ~8 MB handed out through a counter: bounded memory, balanced threads.
        let block = (8 << 20) / (wrow.max(cols * 2)).max(1);
        let block = block.clamp(1, rows);
        let n_blocks = rows.div_ceil(block);
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|sc| -> Result<()> {
            let mut handles = Vec::new();
            for _ in 0..threads.min(n_blocks) {
                let (file, offs, tmp, next) = (&file, &offs, &tmp, &next);
                handles.push(sc.spawn(move || -> Result<()> {
                    let mut row = Vec::new();
                    let (mut wb, mut sb, mut bb) = (Vec::new(), Vec::new(), Vec::new());
                    loop {
                        let bi = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if bi >= n_blocks {
                            return Ok(());
                        }
                        let (b0, b1) = (bi * block, ((bi + 1) * block).min(rows));
                        wb.clear();
                        sb.clear();
                        bb.clear();
                        for r in b0..b1 {
                            draw_row(r, &mut row);
                            if q {
                                let qz = quant::quantize(&row, 1, cols, bits as u32, opts.group_size);
                                wb.extend_from_slice(bytemuck::cast_slice(&qz.words));
                                sb.extend_from_slice(bytemuck::cast_slice(&qz.scales));
                                bb.extend_from_slice(bytemuck::cast_slice(&qz.biases));
                            } else {
                                wb.extend(row.iter().flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes()));
                            }
                        }
                        let e = |e| Error::io(tmp, e);
                        if q {
                            file.write_all_at(&wb, offs[0] + (b0 * wrow) as u64).map_err(e)?;
                            file.write_all_at(&sb, offs[1] + (b0 * grow) as u64).map_err(e)?;
                            file.write_all_at(&bb, offs[2] + (b0 * grow) as u64).map_err(e)?;
                        } else {
                            file.write_all_at(&wb, offs[0] + (b0 * cols * 2) as u64).map_err(e)?;
                        }
                    }
                }));
            }
            for h in handles {
                h.join().map_err(|_| Error::Invalid("synth worker panicked".into()))??;
            }
            Ok(())
        })?;
    }
    if let Some(n) = ordering {
        // A seeded shuffle (Fisher–Yates): every token in exactly one cluster, as the centroid
        // head assumes, and clusters unrelated to token ids. int64, the only dtype the loader
        // takes for it (transformers' buffer).
        let mut rng = SplitMix64(master.next_u64());
        let mut ids: Vec<i64> = (0..n as i64).collect();
        for i in (1..n).rev() {
            ids.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        file.write_all_at(&bytes, stored_iter.next().expect("a stored entry for the ordering")).map_err(io)?;
    }
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    let cfg_path = dir.join("config.json");
    let pretty = serde_json::to_string_pretty(&cfg_json).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(&cfg_path, pretty).map_err(|e| Error::io(&cfg_path, e))?;
    Ok(())
}
