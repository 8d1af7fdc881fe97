//! Kestrel: a Gemma 4 inference runtime.
//!
//! The pieces, in the order a token meets them:
//! - [`config`]: `config.json` → typed config and the per-layer table (sliding/full, KV sharing, PLE).
//! - [`loader`]: memory-mapped safetensors (HF bf16/f16/f32, MLX affine 4/8-bit), every tensor
//!   checked against the shape the config implies.
//! - [`tokenizer`], [`chat`]: text ↔ ids, the model's chat template.
//! - [`backend`]: the step-shaped [`backend::Backend`] trait (prefill a chunk, decode a token)
//!   and its implementations: `cpu` (the f32 reference, the test oracle) and `wgpu` (portable
//!   WGSL kernels).
//! - [`sampler`]: greedy / temperature / top-k / top-p / repetition penalty, seeded.
//! - [`spec`]: speculative decoding: the MTP drafter (`gemma4_assistant`) and what it reads
//!   from the target.
//! - [`engine`]: the generation loop shared by every backend: chunked prefill, decode, stop ids, stats.
//! - [`install`], [`streamer`]: the installed layout (per-layer expert files) and the MoE expert
//!   streamer (a bounded per-layer LFU slot cache fed by positional reads).
//! - [`cli`]: the `kestrel` command line.

pub mod backend;
pub mod chat;
pub mod cli;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod error;
pub mod install;
pub mod kernels;
pub mod kv;
pub mod loader;
pub mod model;
pub mod quant;
pub mod reference;
pub mod sampler;
pub mod spec;
pub mod streamer;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
