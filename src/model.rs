//! A model ready to run: config, shape-checked weights, tokenizer, chat template and stop ids,
//! from a directory or from the copy embedded in the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chat::ChatTemplate;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::loader::installed::{Check, Installation, COMMON, LAYOUT};
use crate::loader::{self, ExpertFiles, FileBytes, ModelWeights, SafetensorsFile, TensorStore};
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
    /// Opens a model directory (config.json, safetensors, optional tokenizer and template), or
    /// an installation (`kestrel install`), hashing its common files now and its expert files
    /// on first use.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, false)
    }

    /// Like [`open`](Self::open); `trust_manifest` skips hashing an installation's large files
    /// (sizes and the small files the manifest binds are still checked).
    pub fn open_with(dir: &Path, trust_manifest: bool) -> Result<Self> {
        if !dir.exists() {
            return Err(Error::Invalid(format!(
                "{}: does not exist (--model expects a model directory holding config.json and *.safetensors)",
                dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "{}: not a directory (--model expects a model directory holding config.json and *.safetensors)",
                dir.display()
            )));
        }
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let weights = if Installation::is_installation(dir) {
            let check = if trust_manifest { Check::Trust } else { Check::Load };
            let inst = Installation::open(dir, check, |_| {})?;
            let store = TensorStore::open_files(&[dir.join(COMMON)])?;
            let mut w = ModelWeights::load_with(&store, &cfg, false)?;
            if let Some(l) = &inst.layout {
                let t = &cfg.text;
                let n_moe = if t.enable_moe_block { cfg.layers.len() } else { 0 };
                l.check(&dir.join(LAYOUT), t.num_experts, t.hidden_size, t.moe_intermediate_size, n_moe)?;
                w.expert_files = Some(Arc::new(ExpertFiles::open(&inst, trust_manifest)?));
            } else if cfg.text.enable_moe_block {
                return Err(Error::Invalid(format!(
                    "{}: a MoE model installed without {LAYOUT}: reinstall it",
                    dir.display()
                )));
            }
            w
        } else {
            let store = TensorStore::open_dir(dir)?;
            ModelWeights::load(&store, &cfg)?
        };
        let weights = Arc::new(weights);
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() { Some(Tokenizer::from_file(&tok_path)?) } else { None };
        let template = ChatTemplate::from_model_dir(dir)?;
        let stop_ids = loader::stop_ids(Some(dir), None, &cfg);
        Ok(Model {
            source: dir.display().to_string(),
            dir: Some(dir.to_path_buf()),
            cfg,
            weights,
            tokenizer,
            template,
            stop_ids,
        })
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
