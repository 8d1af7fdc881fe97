//! `config.json` → a typed [`Config`] plus the derived per-layer table ([`LayerSpec`]).
//!
//! Accepts the three forms Gemma 4 checkpoints come in: the multimodal `gemma4` form (text fields
//! under `text_config`), a bare `gemma4_text` form, and `gemma4_assistant` (the MTP drafter, its
//! decoder under `text_config`). MLX conversions add a `quantization` block. Every field is read
//! from the file: transformers' and mlx-lm's class defaults disagree (spec §6), so a missing
//! required field is an error, never a silent default. What this module does not do: open weights
//! (see `loader`) or decide where anything lives on a device.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Which model family a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A Gemma 4 decoder (E2B, E4B, 26B-A4B, 31B).
    Target,
    /// A `gemma4_assistant` MTP drafter.
    Assistant,
}

/// Attention kind of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnKind {
    Sliding,
    Full,
}

/// Rotary embedding of one attention kind (NeoX / rotate-half form).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub theta: f64,
    /// Number of rotated frequency pairs: `head_dim / 2` for the default rope,
    /// `int(partial * head_dim / 2)` for the proportional rope (the rest have frequency 0).
    pub rotated_pairs: usize,
    pub head_dim: usize,
}

impl Rope {
    /// Inverse frequencies as transformers computes them in f32:
    /// `1 / theta^(2i / head_dim)` for `i < rotated_pairs`, 0 for the rest (length `head_dim/2`).
    /// The exponent's denominator is the full head_dim even for the proportional rope (spec §2.3).
    pub fn inv_freq(&self) -> Vec<f32> {
        (0..self.head_dim / 2)
            .map(|i| {
                if i < self.rotated_pairs {
                    let e = (2 * i) as f32 / self.head_dim as f32;
                    let p = (self.theta as f32 as f64).powf(e as f64) as f32;
                    1.0f32 / p
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// MLX affine quantisation settings (from the `quantization` block).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    pub group_size: usize,
    pub bits: u32,
    /// Per-module overrides, keyed by the module path as written in config.json
    /// (e.g. `language_model.model.layers.0.router.proj` → 8 bits).
    pub overrides: BTreeMap<String, (usize, u32)>,
}

impl QuantConfig {
    /// Group size and bits for the module at `path` (checkpoint name without `.weight`).
    pub fn for_module(&self, path: &str) -> (usize, u32) {
        self.overrides.get(path).copied().unwrap_or((self.group_size, self.bits))
    }
}

/// The decoder's hyper-parameters (HF `text_config` names).
#[derive(Debug, Clone)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub num_global_key_value_heads: Option<usize>,
    pub head_dim: usize,
    pub global_head_dim: usize,
    pub sliding_window: usize,
    pub layer_types: Vec<AttnKind>,
    pub final_logit_softcapping: Option<f32>,
    pub rms_norm_eps: f32,
    pub rope_sliding: Rope,
    pub rope_full: Rope,
    pub hidden_size_per_layer_input: usize,
    pub vocab_size_per_layer_input: usize,
    pub num_kv_shared_layers: usize,
    pub use_double_wide_mlp: bool,
    pub attention_k_eq_v: bool,
    pub enable_moe_block: bool,
    pub num_experts: usize,
    pub top_k_experts: usize,
    pub moe_intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
}

/// Fields only the MTP drafter has.
#[derive(Debug, Clone)]
pub struct AssistantConfig {
    pub backbone_hidden_size: usize,
    pub use_ordered_embeddings: bool,
    pub num_centroids: usize,
    pub centroid_intermediate_top_k: usize,
}

/// Where a layer's K/V come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// The layer computes K/V and owns cache number `cache` (dense index over owning layers).
    Own { cache: usize },
    /// KV-shared layer: reads the cache of layer `producer` (the last non-shared layer of the
    /// same attention kind, spec §1.2 pitfall 8). Drafter layers share with the *target's* producer.
    Shared { producer: usize },
}

/// Everything the forward pass needs to know about one layer.
#[derive(Debug, Clone)]
pub struct LayerSpec {
    pub index: usize,
    pub kind: AttnKind,
    pub head_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub kv: KvSource,
    /// V is the K projection (26B full layers); there is no `v_proj`.
    pub k_eq_v: bool,
    /// Dense MLP width of this layer (double-wide on KV-shared layers when enabled).
    pub mlp_width: usize,
    pub rope: Rope,
}

impl LayerSpec {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    pub fn owns_kv(&self) -> bool {
        matches!(self.kv, KvSource::Own { .. })
    }
}

/// A parsed model configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub kind: ModelKind,
    pub text: TextConfig,
    pub quant: Option<QuantConfig>,
    pub assistant: Option<AssistantConfig>,
    pub bos_token_id: u32,
    /// Stop ids from config.json (`eos_token_id`, top level or text_config).
    pub eos_token_ids: Vec<u32>,
    pub layers: Vec<LayerSpec>,
}

impl Config {
    /// Reads and parses `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// Parses config JSON text; `path` only names the source in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| Error::config(path, format!("not valid JSON: {e}")))?;
        parse(&root, path)
    }

    pub fn hidden(&self) -> usize {
        self.text.hidden_size
    }

    /// Index of the first KV-shared layer (= number of layers that own a cache).
    pub fn first_shared_layer(&self) -> usize {
        self.text.num_hidden_layers - self.text.num_kv_shared_layers
    }

    /// The producer layer of each attention kind: the last non-shared layer of that kind.
    pub fn producer(&self, kind: AttnKind) -> Option<usize> {
        (0..self.first_shared_layer()).rev().find(|&i| self.text.layer_types[i] == kind)
    }

    /// Layers that own a KV cache, in order.
    pub fn kv_owning_layers(&self) -> impl Iterator<Item = &LayerSpec> {
        self.layers.iter().filter(|l| l.owns_kv())
    }

    pub fn has_ple(&self) -> bool {
        self.text.hidden_size_per_layer_input > 0
    }
}

// ---------------------------------------------------------------------------------------------

/// A small reader that turns JSON lookups into errors naming the field.
struct Fields<'a> {
    obj: &'a Value,
    prefix: &'a str,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn err(&self, field: &str, what: &str) -> Error {
        Error::config(self.path, format!("field `{}{}` {}", self.prefix, field, what))
    }
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }
    fn usize(&self, field: &str) -> Result<usize> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        v.as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| self.err(field, &format!("must be a non-negative integer, found {v}")))
    }
    fn usize_or(&self, field: &str, default: usize) -> Result<usize> {
        if self.get(field).is_some() {
            self.usize(field)
        } else {
            Ok(default)
        }
    }
    fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        if self.get(field).is_some() {
            self.usize(field).map(Some)
        } else {
            Ok(None)
        }
    }
    fn f64(&self, field: &str) -> Result<f64> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        v.as_f64().ok_or_else(|| self.err(field, &format!("must be a number, found {v}")))
    }
    fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(field, &format!("must be true or false, found {v}"))),
        }
    }
    fn str(&self, field: &str) -> Result<&'a str> {
        let v = self.get(field).ok_or_else(|| self.err(field, "is missing"))?;
        v.as_str().ok_or_else(|| self.err(field, &format!("must be a string, found {v}")))
    }
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

fn parse(root: &Value, path: &Path) -> Result<Config> {
    if !root.is_object() {
        return Err(Error::config(path, "must be a JSON object"));
    }
    let top = Fields { obj: root, prefix: "", path };
    let model_type = top.str("model_type")?;
    let (kind, text_obj, prefix) = match model_type {
        "gemma4" => (
            ModelKind::Target,
            top.get("text_config").ok_or_else(|| top.err("text_config", "is missing (model_type gemma4)"))?,
            "text_config.",
        ),
        "gemma4_text" => (ModelKind::Target, root, ""),
        "gemma4_assistant" => (
            ModelKind::Assistant,
            top.get("text_config").ok_or_else(|| top.err("text_config", "is missing (model_type gemma4_assistant)"))?,
            "text_config.",
        ),
        other => {
            return Err(Error::config(
                path,
                format!(
                    "field `model_type` is \"{other}\": Kestrel runs Gemma 4 (gemma4, gemma4_text, gemma4_assistant)"
                ),
            ))
        }
    };
    let f = Fields { obj: text_obj, prefix, path };
    let text = parse_text(&f, kind)?;

    let quant = parse_quant(root, path)?;
    let assistant = if kind == ModelKind::Assistant {
        Some(AssistantConfig {
            backbone_hidden_size: top.usize("backbone_hidden_size")?,
            use_ordered_embeddings: top.bool_or("use_ordered_embeddings", false)?,
            num_centroids: top.usize_or("num_centroids", 2048)?,
            centroid_intermediate_top_k: top.usize_or("centroid_intermediate_top_k", 32)?,
        })
    } else {
        None
    };
    if let Some(a) = &assistant {
        if a.use_ordered_embeddings && (a.num_centroids == 0 || text.vocab_size % a.num_centroids != 0) {
            return Err(top
                .err("num_centroids", &format!("({}) must divide vocab_size ({})", a.num_centroids, text.vocab_size)));
        }
    }

    let mut eos = token_ids(root.get("eos_token_id"));
    if eos.is_empty() {
        eos = token_ids(text_obj.get("eos_token_id"));
    }
    let bos =
        root.get("bos_token_id").or_else(|| text_obj.get("bos_token_id")).and_then(|v| v.as_u64()).unwrap_or(2) as u32;

    let layers = derive_layers(&text, kind);
    Ok(Config { kind, text, quant, assistant, bos_token_id: bos, eos_token_ids: eos, layers })
}

fn parse_rope(f: &Fields, kind: &str, head_dim: usize) -> Result<Rope> {
    let field = format!("rope_parameters.{kind}");
    let params = f.get("rope_parameters").and_then(|r| r.get(kind)).ok_or_else(|| f.err(&field, "is missing"))?;
    let p = Fields { obj: params, prefix: "", path: f.path };
    let err = |what: &str| f.err(&field, what);
    let theta = p.f64("rope_theta").map_err(|_| err("needs a numeric rope_theta"))?;
    let rope_type = p.str("rope_type").unwrap_or("default");
    let rotated_pairs = match rope_type {
        "default" => head_dim / 2,
        "proportional" => {
            let partial = p.f64("partial_rotary_factor").unwrap_or(1.0);
            if !(0.0..=1.0).contains(&partial) {
                return Err(err(&format!("has partial_rotary_factor {partial}, expected 0..1")));
            }
            // transformers: int(partial_rotary_factor * head_dim // 2)
            ((partial * head_dim as f64) / 2.0).floor() as usize
        }
        other => {
            return Err(err(&format!("has rope_type \"{other}\": supported are \"default\" and \"proportional\"")))
        }
    };
    Ok(Rope { theta, rotated_pairs, head_dim })
}

fn parse_text(f: &Fields, kind: ModelKind) -> Result<TextConfig> {
    let n_layers = f.usize("num_hidden_layers")?;
    let layer_types: Vec<AttnKind> = match f.get("layer_types") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(AttnKind::Sliding),
                Some("full_attention") => Ok(AttnKind::Full),
                _ => Err(f.err(
                    "layer_types",
                    &format!("has entry {t}: expected \"sliding_attention\" or \"full_attention\""),
                )),
            })
            .collect::<Result<_>>()?,
        _ => return Err(f.err("layer_types", "is missing or not a list")),
    };
    if layer_types.len() != n_layers {
        return Err(
            f.err("layer_types", &format!("has {} entries but num_hidden_layers is {n_layers}", layer_types.len()))
        );
    }
    let activation = f.str("hidden_activation").unwrap_or("gelu_pytorch_tanh");
    if activation != "gelu_pytorch_tanh" {
        return Err(f.err("hidden_activation", &format!("is \"{activation}\": only gelu_pytorch_tanh is supported")));
    }
    if f.bool_or("attention_bias", false)? {
        return Err(f.err("attention_bias", "is true: Gemma 4 has no attention bias"));
    }
    let head_dim = f.usize("head_dim")?;
    let global_head_dim = f.usize_or("global_head_dim", head_dim)?;
    let softcap = match f.get("final_logit_softcapping") {
        None => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| f.err("final_logit_softcapping", "must be a number or null"))? as f32),
    };
    let num_kv_shared_layers = match kind {
        // transformers' assistant __post_init__: every drafter layer reads the target's KV.
        ModelKind::Assistant => f.usize_or("num_kv_shared_layers", n_layers)?,
        ModelKind::Target => f.usize_or("num_kv_shared_layers", 0)?,
    };
    let enable_moe_block = f.bool_or("enable_moe_block", false)?;
    let t = TextConfig {
        vocab_size: f.usize("vocab_size")?,
        hidden_size: f.usize("hidden_size")?,
        intermediate_size: f.usize("intermediate_size")?,
        num_hidden_layers: n_layers,
        num_attention_heads: f.usize("num_attention_heads")?,
        num_key_value_heads: f.usize("num_key_value_heads")?,
        num_global_key_value_heads: f.opt_usize("num_global_key_value_heads")?,
        head_dim,
        global_head_dim,
        sliding_window: f.usize("sliding_window")?,
        layer_types,
        final_logit_softcapping: softcap,
        rms_norm_eps: f.get("rms_norm_eps").and_then(|v| v.as_f64()).unwrap_or(1e-6) as f32,
        rope_sliding: parse_rope(f, "sliding_attention", head_dim)?,
        rope_full: parse_rope(f, "full_attention", global_head_dim)?,
        hidden_size_per_layer_input: f.usize_or("hidden_size_per_layer_input", 0)?,
        vocab_size_per_layer_input: f.usize_or("vocab_size_per_layer_input", 0)?,
        num_kv_shared_layers,
        use_double_wide_mlp: f.bool_or("use_double_wide_mlp", false)?,
        attention_k_eq_v: f.bool_or("attention_k_eq_v", false)?,
        enable_moe_block,
        num_experts: if enable_moe_block { f.usize("num_experts")? } else { 0 },
        top_k_experts: if enable_moe_block { f.usize("top_k_experts")? } else { 0 },
        moe_intermediate_size: if enable_moe_block { f.usize("moe_intermediate_size")? } else { 0 },
        max_position_embeddings: f.usize("max_position_embeddings")?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
    };
    validate(&t, f)?;
    Ok(t)
}

fn validate(t: &TextConfig, f: &Fields) -> Result<()> {
    let nonzero = [
        ("vocab_size", t.vocab_size),
        ("hidden_size", t.hidden_size),
        ("num_hidden_layers", t.num_hidden_layers),
        ("num_attention_heads", t.num_attention_heads),
        ("num_key_value_heads", t.num_key_value_heads),
        ("head_dim", t.head_dim),
        ("global_head_dim", t.global_head_dim),
        ("sliding_window", t.sliding_window),
        ("max_position_embeddings", t.max_position_embeddings),
    ];
    for (name, v) in nonzero {
        if v == 0 {
            return Err(f.err(name, "must be greater than 0"));
        }
    }
    for (name, d) in [("head_dim", t.head_dim), ("global_head_dim", t.global_head_dim)] {
        if d % 2 != 0 || d > 1024 {
            return Err(f.err(name, &format!("is {d}: must be even and at most 1024")));
        }
    }
    if !t.num_attention_heads.is_multiple_of(t.num_key_value_heads) {
        return Err(f.err(
            "num_key_value_heads",
            &format!("({}) must divide num_attention_heads ({})", t.num_key_value_heads, t.num_attention_heads),
        ));
    }
    if let Some(g) = t.num_global_key_value_heads {
        if g == 0 || !t.num_attention_heads.is_multiple_of(g) {
            return Err(f.err(
                "num_global_key_value_heads",
                &format!("({g}) must divide num_attention_heads ({})", t.num_attention_heads),
            ));
        }
    }
    if t.num_kv_shared_layers > t.num_hidden_layers {
        return Err(f.err("num_kv_shared_layers", "exceeds num_hidden_layers"));
    }
    if !t.tie_word_embeddings {
        return Err(f.err("tie_word_embeddings", "is false: Kestrel supports the tied LM head Gemma 4 ships with"));
    }
    if t.enable_moe_block && (t.top_k_experts == 0 || t.top_k_experts > t.num_experts) {
        return Err(f.err("top_k_experts", "must be between 1 and num_experts"));
    }
    if t.hidden_size_per_layer_input > 0 && t.vocab_size_per_layer_input != t.vocab_size {
        return Err(f.err(
            "vocab_size_per_layer_input",
            &format!("({}) must equal vocab_size ({})", t.vocab_size_per_layer_input, t.vocab_size),
        ));
    }
    Ok(())
}

fn parse_quant(root: &Value, path: &Path) -> Result<Option<QuantConfig>> {
    let Some(q) = root.get("quantization").or_else(|| root.get("quantization_config")).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let f = Fields { obj: q, prefix: "quantization.", path };
    let mode = f.str("mode").unwrap_or("affine");
    if mode != "affine" {
        return Err(f.err("mode", &format!("is \"{mode}\": only MLX affine quantisation is supported")));
    }
    let group_size = f.usize("group_size")?;
    let bits = f.usize("bits")? as u32;
    let check = |gs: usize, b: u32, field: &str| -> Result<()> {
        if b != 4 && b != 8 {
            return Err(f.err(field, &format!("has bits {b}: supported are 4 and 8")));
        }
        if gs == 0 || !gs.is_multiple_of(32) {
            return Err(f.err(field, &format!("has group_size {gs}: must be a multiple of 32")));
        }
        Ok(())
    };
    check(group_size, bits, "bits")?;
    let mut overrides = BTreeMap::new();
    if let Some(obj) = q.as_object() {
        for (k, v) in obj {
            if let Some(o) = v.as_object() {
                let gs = o.get("group_size").and_then(|x| x.as_u64()).unwrap_or(group_size as u64) as usize;
                let b = o.get("bits").and_then(|x| x.as_u64()).unwrap_or(bits as u64) as u32;
                check(gs, b, k)?;
                overrides.insert(k.clone(), (gs, b));
            }
        }
    }
    Ok(Some(QuantConfig { group_size, bits, overrides }))
}

fn derive_layers(t: &TextConfig, kind: ModelKind) -> Vec<LayerSpec> {
    let n = t.num_hidden_layers;
    let first_shared = n - t.num_kv_shared_layers;
    let producer = |k: AttnKind| (0..first_shared).rev().find(|&i| t.layer_types[i] == k);
    let mut next_cache = 0;
    (0..n)
        .map(|i| {
            let kind_i = t.layer_types[i];
            let full = kind_i == AttnKind::Full;
            let k_eq_v = full && t.attention_k_eq_v;
            let n_kv_heads = if k_eq_v {
                t.num_global_key_value_heads.unwrap_or(t.num_key_value_heads)
            } else {
                t.num_key_value_heads
            };
            let kv = if i < first_shared {
                next_cache += 1;
                KvSource::Own { cache: next_cache - 1 }
            } else {
                // A drafter has no layers of its own to borrow from: `producer` is resolved
                // against the target at run time (it is only a marker here).
                KvSource::Shared {
                    producer: if kind == ModelKind::Assistant {
                        usize::MAX
                    } else {
                        producer(kind_i).unwrap_or(usize::MAX)
                    },
                }
            };
            let shared = i >= first_shared;
            LayerSpec {
                index: i,
                kind: kind_i,
                head_dim: if full { t.global_head_dim } else { t.head_dim },
                n_heads: t.num_attention_heads,
                n_kv_heads,
                kv,
                k_eq_v,
                mlp_width: if shared && t.use_double_wide_mlp { 2 * t.intermediate_size } else { t.intermediate_size },
                rope: if full { t.rope_full } else { t.rope_sliding },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Config {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("config.json");
        Config::from_file(&p).unwrap()
    }

    #[test]
    fn e2b_layer_table() {
        let c = fixture("tiny-e2b/hf");
        assert_eq!(c.kind, ModelKind::Target);
        assert_eq!(c.first_shared_layer(), 5);
        assert_eq!(c.producer(AttnKind::Sliding), Some(3));
        assert_eq!(c.producer(AttnKind::Full), Some(4));
        assert_eq!(c.layers[9].kv, KvSource::Shared { producer: 4 });
        assert_eq!(c.layers[7].kv, KvSource::Shared { producer: 3 });
        assert_eq!(c.layers[4].head_dim, 64);
        assert_eq!(c.layers[4].rope.rotated_pairs, 8); // int(0.25 * 64 // 2)
        assert_eq!(c.layers[3].mlp_width, 128);
        assert_eq!(c.layers[5].mlp_width, 256); // double-wide on shared layers
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert!(c.quant.is_none());
    }

    #[test]
    fn mlx_quant_and_moe_parse() {
        let c = fixture("tiny-moe/mlx-4bit");
        let q = c.quant.as_ref().unwrap();
        assert_eq!((q.group_size, q.bits), (64, 4));
        assert_eq!(q.for_module("language_model.model.layers.0.router.proj"), (64, 8));
        assert!(c.text.enable_moe_block);
        assert_eq!(c.layers[5].n_kv_heads, 1); // global kv heads on the k_eq_v full layer
        assert!(c.layers[5].k_eq_v);
        assert_eq!(c.layers[0].n_kv_heads, 2);
    }

    #[test]
    fn assistant_parses() {
        let c = fixture("tiny-e2b-assistant/hf");
        assert_eq!(c.kind, ModelKind::Assistant);
        let a = c.assistant.as_ref().unwrap();
        assert_eq!(a.backbone_hidden_size, 128);
        assert!(a.use_ordered_embeddings);
        assert!(c.layers.iter().all(|l| !l.owns_kv()));
    }

    #[test]
    fn proportional_inv_freq() {
        let r = Rope { theta: 1e6, rotated_pairs: 64, head_dim: 512 };
        let f = r.inv_freq();
        assert_eq!(f.len(), 256);
        assert_eq!(f[0], 1.0);
        assert!(f[63] > 0.0 && f[64] == 0.0 && f[255] == 0.0);
        // 1e6^(-126/512)
        assert!((f[63] as f64 - 1e6f64.powf(-126.0 / 512.0)).abs() < 1e-9);
    }

    #[test]
    fn unsupported_values_name_the_field() {
        let base = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-e2b/hf/config.json"),
        )
        .unwrap();
        let cases = [
            ("\"gelu_pytorch_tanh\"", "\"silu\"", "hidden_activation"),
            ("\"proportional\"", "\"yarn\"", "rope_parameters.full_attention"),
            ("\"model_type\": \"gemma4\"", "\"model_type\": \"llama\"", "model_type"),
            ("\"head_dim\": 32", "\"head_dim\": 0", "head_dim"),
        ];
        for (from, to, field) in cases {
            let bad = base.replacen(from, to, 1);
            assert_ne!(bad, base, "{from} not found in fixture");
            let e = Config::from_json_str(&bad, Path::new("config.json")).unwrap_err().to_string();
            assert!(e.contains(field), "error `{e}` does not name `{field}`");
        }
    }
}
