//! The library's error type. Every variant carries what a user needs to act: the file, the
//! tensor, what was expected and what was found, and (in the message) the likely fix.

use std::path::PathBuf;

/// Errors raised by the library. The binary adds context with `anyhow` at the edge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The OS reason is part of the message and deliberately not also a `source()`: the CLI
    // prints the whole chain, which would repeat it ("…: No such file…: No such file…").
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },

    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },

    #[error("{file}: {msg}")]
    Safetensors { file: PathBuf, msg: String },

    #[error("model is missing tensor `{name}` (looked for {tried}): is this a Gemma 4 checkpoint, and is every shard present?")]
    MissingTensor { name: String, tried: String },

    #[error("{file}: tensor `{name}` has shape {found:?}, config.json implies {expected:?}: is config.json from another model?")]
    Shape { file: PathBuf, name: String, expected: Vec<usize>, found: Vec<usize> },

    #[error("{file}: tensor `{name}` has dtype {found}, expected {expected}")]
    DType { file: PathBuf, name: String, expected: String, found: String },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    Template(String),

    #[error("prompt of {prompt} tokens plus {max_new} new tokens exceeds the context of {ctx} tokens: shorten the prompt, lower --max-new or raise --ctx (model limit {model_max})")]
    ContextOverflow { prompt: usize, max_new: usize, ctx: usize, model_max: usize },

    #[error("GPU: {0}")]
    Gpu(String),

    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), err: source }
    }
    pub fn config(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Config { path: path.into(), msg: msg.into() }
    }
}
