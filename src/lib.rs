//! Kestrel: a Gemma 4 inference runtime.
//!
//! The pieces, in the order a token meets them:
//! - [`config`]: `config.json` → typed config and the per-layer table (sliding/full, KV sharing, PLE).
//! - [`loader`]: memory-mapped safetensors (HF bf16/f16/f32, MLX affine 4/8-bit), every tensor
//!   checked against the shape the config implies.
//! - [`tokenizer`], [`chat`]: text ↔ ids, the model's chat template.
//! - [`reference`](mod@reference): the f32 math every backend, the drafter and the tests are judged by.
//! - [`kernels`]: the backend-neutral kernel contracts: ids, params structs, the shape rules and
//!   the [`kernels::Tuning`] a backend is built with.
//! - [`backend`]: the step-shaped [`backend::Backend`] trait (prefill a chunk, decode a token)
//!   and its implementations: `cpu` (the f32 reference backend) and `wgpu` (portable WGSL
//!   kernels).
//! - [`sampler`]: greedy / temperature / top-k / top-p / repetition penalty, seeded.
//! - [`spec`]: speculative decoding: the MTP drafter (`gemma4_assistant`) and what it reads
//!   from the target.
//! - [`engine`]: the generation loop shared by every backend: chunked prefill, decode, stop ids,
//!   stats, and the speculative loop.
//! - [`install`], [`streamer`]: writing the installed layout (per-layer expert files; the loader
//!   reads it) and the MoE expert streamer (a bounded per-layer LFU slot cache fed by positional
//!   reads).
//!
//! `docs/ARCHITECTURE.md` walks the same path in more detail.
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
