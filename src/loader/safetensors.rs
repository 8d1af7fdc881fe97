//! Memory-mapped safetensors files: header parse and bounds checks, no copies.
//!
//! The header is parsed and validated by the `safetensors` crate (it rejects truncated files,
//! overlapping or out-of-range offsets and malformed JSON); this module maps each file once and
//! hands out byte ranges into the mapping. A model directory is one `model.safetensors`, or the
//! shards listed by `model.safetensors.index.json`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::error::{Error, Result};
use crate::quant::DType;

/// The bytes of one file: a read-only mapping, or a static slice (the model embedded in the binary).
pub enum FileBytes {
    Mapped(Mmap),
    Static(&'static [u8]),
}

impl FileBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Static(s) => s,
        }
    }
}

/// One safetensors file, mapped, with its validated header.
pub struct SafetensorsFile {
    pub path: PathBuf,
    bytes: FileBytes,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
    tensors: HashMap<String, TensorEntry>,
}

/// Where one tensor lives inside its file.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub dtype: DType,
    /// The dtype as the file names it (`U8`, `F64`, ...), for messages about unsupported ones.
    pub file_dtype: String,
    pub shape: Vec<usize>,
    /// Byte range relative to the data section.
    pub start: usize,
    pub end: usize,
}

fn map_dtype(d: StDtype) -> DType {
    match d {
        StDtype::BF16 => DType::BF16,
        StDtype::F16 => DType::F16,
        StDtype::F32 => DType::F32,
        StDtype::U32 => DType::U32,
        StDtype::I64 => DType::I64,
        _ => DType::Other,
    }
}

fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer | E::InvalidHeaderLength | E::HeaderTooSmall => {
            "file is truncated or its header is damaged (sizes in the header do not match the file): re-download or re-convert it".into()
        }
        E::InvalidHeaderStart | E::InvalidHeader(_) | E::InvalidHeaderDeserialization(_) => {
            "not a safetensors file (header is not valid JSON)".into()
        }
        // The first 8 bytes are not a plausible header length: some other kind of file.
        E::HeaderTooLarge => "not a safetensors file (its first 8 bytes are not a header length)".into(),
        other => format!("invalid safetensors file: {other}"),
    }
}

impl SafetensorsFile {
    /// Maps `path` and validates its header.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a file changed underneath a running process is
        // outside what any mmap-based loader can defend against (as in every peer).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::from_bytes(path.to_path_buf(), FileBytes::Mapped(mmap))
    }

    /// Wraps bytes already in memory (`path` only names them in errors).
    pub fn from_bytes(path: PathBuf, bytes: FileBytes) -> Result<Self> {
        let (header_len, meta) = SafeTensors::read_metadata(bytes.as_slice())
            .map_err(|e| Error::Safetensors { file: path.clone(), msg: describe(&e) })?;
        let mut tensors = HashMap::new();
        for (name, info) in meta.tensors() {
            let (start, end) = info.data_offsets;
            tensors.insert(
                name,
                TensorEntry {
                    dtype: map_dtype(info.dtype),
                    file_dtype: info.dtype.to_string(),
                    shape: info.shape.clone(),
                    start,
                    end,
                },
            );
        }
        Ok(SafetensorsFile { path, bytes, data_start: 8 + header_len, tensors })
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    /// The bytes of a tensor (validated against the file length when the header was read).
    pub fn data(&self, e: &TensorEntry) -> &[u8] {
        &self.bytes.as_slice()[self.data_start + e.start..self.data_start + e.end]
    }
}

/// All tensors of a checkpoint, across shards.
pub struct TensorStore {
    files: Vec<Arc<SafetensorsFile>>,
    index: HashMap<String, usize>,
}

/// A handle to one stored tensor: its file (kept alive), dtype, shape and byte range.
#[derive(Clone)]
pub struct TensorRef {
    pub name: String,
    file: Arc<SafetensorsFile>,
    pub entry: TensorEntry,
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        self.file.data(&self.entry)
    }
    pub fn dtype(&self) -> DType {
        self.entry.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.entry.shape
    }
    /// The dtype as the file names it (also for dtypes Kestrel does not read).
    pub fn dtype_name(&self) -> String {
        self.entry.file_dtype.clone()
    }
    pub fn path(&self) -> &Path {
        &self.file.path
    }
    /// Absolute byte offset of the tensor's data in its file (for positional reads that bypass
    /// the mapping, e.g. `kestrel install`'s bounded-memory copy).
    pub fn file_offset(&self) -> u64 {
        (self.file.data_start + self.entry.start) as u64
    }
}

impl TensorStore {
    /// Opens `model.safetensors.index.json` (all shards it lists) or `model.safetensors` in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut names: Vec<PathBuf> = Vec::new();
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::Safetensors { file: index_path.clone(), msg: format!("not valid JSON: {e}") })?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::Safetensors {
                file: index_path.clone(),
                msg: "has no `weight_map` object".into(),
            })?;
            let shards: BTreeSet<&str> = map.values().filter_map(|s| s.as_str()).collect();
            for s in shards {
                if s.contains('/') || s.contains('\\') || s == ".." {
                    return Err(Error::Safetensors {
                        file: index_path.clone(),
                        msg: format!("shard name `{s}` points outside the model directory"),
                    });
                }
                if !dir.join(s).is_file() {
                    return Err(Error::Safetensors {
                        file: index_path.clone(),
                        msg: format!("lists shard `{s}`, which is not in the directory: is every shard downloaded?"),
                    });
                }
                names.push(dir.join(s));
            }
        } else if dir.join("model.safetensors").exists() {
            names.push(dir.join("model.safetensors"));
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(Error::Safetensors {
                    file: dir.to_path_buf(),
                    msg: "no model.safetensors, model.safetensors.index.json or *.safetensors here: is this a model directory?".into(),
                });
            }
            names = found;
        }
        Self::open_files(&names)
    }

    /// Opens exactly these safetensors files.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let files = paths.iter().map(|p| SafetensorsFile::open(p)).collect::<Result<Vec<_>>>()?;
        Ok(Self::from_files(files))
    }

    pub fn from_files(files: Vec<SafetensorsFile>) -> Self {
        let files: Vec<Arc<SafetensorsFile>> = files.into_iter().map(Arc::new).collect();
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for n in f.names() {
                index.insert(n.clone(), i);
            }
        }
        TensorStore { files, index }
    }

    pub fn get(&self, name: &str) -> Option<TensorRef> {
        let &i = self.index.get(name)?;
        let file = self.files[i].clone();
        let entry = file.entry(name)?.clone();
        Some(TensorRef { name: name.to_string(), file, entry })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.index.keys()
    }

    /// A path to name in errors about the checkpoint as a whole.
    pub fn first_path(&self) -> PathBuf {
        self.files.first().map(|f| f.path.clone()).unwrap_or_default()
    }
}
