//! The default model compiled into the binary, so `kestrel generate` works on a fresh machine
//! with no download. For now it is the `tiny-e2b` test fixture in MLX 4-bit form (1 MB, random
//! weights: its text is gibberish, but every stage of the real pipeline runs on it).

/// The files of an embedded model.
pub struct EmbeddedModel {
    pub name: &'static str,
    pub config: &'static str,
    pub generation_config: &'static str,
    pub tokenizer: &'static [u8],
    pub tokenizer_config: &'static str,
    pub chat_template: &'static str,
    pub safetensors: &'static [u8],
}

macro_rules! fixture {
    ($f:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-e2b/mlx-4bit/", $f)
    };
}

pub const DEFAULT: EmbeddedModel = EmbeddedModel {
    name: "tiny-e2b-4bit",
    config: include_str!(fixture!("config.json")),
    generation_config: include_str!(fixture!("generation_config.json")),
    tokenizer: include_bytes!(fixture!("tokenizer.json")),
    tokenizer_config: include_str!(fixture!("tokenizer_config.json")),
    chat_template: include_str!(fixture!("chat_template.jinja")),
    safetensors: include_bytes!(fixture!("model.safetensors")),
};
