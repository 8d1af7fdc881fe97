//! A model ready to run: config, shape-checked weights, tokenizer, chat template and stop ids,
//! from a directory or from the copy embedded in the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chat::ChatTemplate;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::loader::{self, FileBytes, ModelWeights, SafetensorsFile, TensorStore};
use crate::tokenizer::Tokenizer;

/// Everything loaded from a model directory.
pub struct Model {
    /// Where it came from (a path, or `embedded:<name>`), for messages.
    pub source: String,
    pub dir: Option<PathBuf>,
    pub cfg: Config,
    pub weights: Arc<ModelWeights>,
    pub tokenizer: Option<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub stop_ids: Vec<u32>,
}

impl Model {
    /// Opens a model directory (config.json, safetensors, optional tokenizer and template).
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.exists() {
            return Err(Error::Invalid(format!("{}: does not exist (--model expects a model directory holding config.json and *.safetensors)", dir.display())));
        }
        if !dir.is_dir() {
            return Err(Error::Invalid(format!("{}: not a directory (--model expects a model directory holding config.json and *.safetensors)", dir.display())));
        }
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let store = TensorStore::open_dir(dir)?;
        let weights = Arc::new(ModelWeights::load(&store, &cfg)?);
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() { Some(Tokenizer::from_file(&tok_path)?) } else { None };
        let template = ChatTemplate::from_model_dir(dir)?;
        let stop_ids = loader::stop_ids(Some(dir), None, &cfg);
        Ok(Model { source: dir.display().to_string(), dir: Some(dir.to_path_buf()), cfg, weights, tokenizer, template, stop_ids })
    }

    /// The small model compiled into the binary (see `embedded`).
    pub fn embedded() -> Result<Self> {
        let e = crate::embedded::DEFAULT;
        let path = Path::new(e.name);
        let cfg = Config::from_json_str(e.config, &path.join("config.json"))?;
        let file = SafetensorsFile::from_bytes(path.join("model.safetensors"), FileBytes::Static(e.safetensors))?;
        let store = TensorStore::from_files(vec![file]);
        let weights = Arc::new(ModelWeights::load(&store, &cfg)?);
        let tokenizer = Some(Tokenizer::from_bytes(e.tokenizer)?);
        let template = Some(ChatTemplate::from_sources(e.chat_template, Some(e.tokenizer_config))?);
        let stop_ids = loader::stop_ids(None, Some(e.generation_config), &cfg);
        Ok(Model { source: format!("embedded:{}", e.name), dir: None, cfg, weights, tokenizer, template, stop_ids })
    }
}
