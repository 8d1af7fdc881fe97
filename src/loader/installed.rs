//! Kestrel's installed model layout: what `kestrel install` writes (`crate::install`) and what
//! loading, `kestrel verify` and the expert streamer read ([`ExpertFiles`]: the per-layer expert
//! files, opened, hashed on first use, read one expert blob at a time).
//!
//! ```text
//! DIR/
//!   manifest.json        format, version, architecture, sizes, and bytes + SHA-256 of every file
//!   config.json          the source's config, unchanged
//!   common.safetensors   every tensor but the routed experts, bytes unchanged
//!   experts.json         the expert blob layout (below)
//!   experts/layer-NNN.bin  one file per MoE layer: n_experts blobs at a fixed, page-aligned stride
//!   tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json (if present)
//! ```
//!
//! An expert blob holds, for one expert of one layer, the rows of every routed tensor in the
//! source's own encoding (MLX packed words, bf16 scales and biases; or bf16/f32 values) copied
//! byte for byte — never requantised. Each piece starts at a multiple of [`PART_ALIGN`] inside the
//! blob and blobs start at multiples of [`BLOB_ALIGN`] (a page), so one expert is one aligned
//! positional read, and its pieces can be copied straight into a GPU slot.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::quant::{self, DType, QuantLayout};

pub const FORMAT: &str = "kestrel-installed-model";
/// The one layout version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
pub const MANIFEST: &str = "manifest.json";
pub const CONFIG: &str = "config.json";
pub const COMMON: &str = "common.safetensors";
pub const LAYOUT: &str = "experts.json";
pub const EXPERT_DIR: &str = "experts";
/// Blob stride alignment: a page, so positional reads are page-aligned.
pub const BLOB_ALIGN: u64 = 4096;
/// Alignment of each piece inside a blob (≥ wgpu's 4-byte copy alignment, a cache line pair).
pub const PART_ALIGN: u64 = 256;
/// Files above this size are "large": `--trust-manifest` checks their size, not their hash.
pub const LARGE_FILE: u64 = 64 << 20;

/// Small files copied from the source directory when present.
pub const SIDE_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
];

pub fn layer_file(layer: usize) -> String {
    format!("{EXPERT_DIR}/layer-{layer:03}.bin")
}

/// One file of an installation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the installation directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    pub common_bytes: u64,
    pub expert_bytes: u64,
    pub n_moe_layers: usize,
    pub n_experts: usize,
    pub top_k: usize,
    pub expert_stride: u64,
}

/// `manifest.json`. Deterministic (no timestamps): a resumed install writes the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// `model_type` and shape, e.g. `gemma4 (30 layers, hidden 2816, 128 experts top-8)`.
    pub architecture: String,
    pub sizes: Sizes,
    /// Sorted by path.
    pub files: Vec<FileEntry>,
}

/// How one routed matrix of one expert is stored in a blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartLayout {
    /// `gate_up` (HF fused: rows [0, I) gate, [I, 2I) up), `gate`, `up` or `down`.
    pub role: String,
    /// `bf16`, `f16`, `f32`, `q4` or `q8`.
    pub format: String,
    /// Group size of quantised formats (0 for float).
    pub group_size: usize,
    /// Rows and columns of this expert's matrix.
    pub rows: usize,
    pub cols: usize,
    /// Byte offset of the values (packed words for quantised formats) in the blob, and length.
    pub w: (u64, u64),
    /// Scales and biases (quantised formats), `(offset, bytes)`.
    pub scales: Option<(u64, u64)>,
    pub biases: Option<(u64, u64)>,
}

impl PartLayout {
    pub fn dtype(&self) -> DType {
        match self.format.as_str() {
            "f16" => DType::F16,
            "f32" => DType::F32,
            _ => DType::BF16,
        }
    }
    pub fn bits(&self) -> Option<u32> {
        match self.format.as_str() {
            "q4" => Some(4),
            "q8" => Some(8),
            _ => None,
        }
    }
    /// Row `r` of this part of `blob` as f32, exactly as the resident path dequantises it.
    pub fn row_f32(&self, blob: &[u8], r: usize, out: &mut [f32]) {
        let w = &blob[self.w.0 as usize..(self.w.0 + self.w.1) as usize];
        match (self.bits(), self.scales, self.biases) {
            (Some(bits), Some(s), Some(b)) => {
                let l = QuantLayout { rows: self.rows, cols: self.cols, bits, group_size: self.group_size };
                let s = &blob[s.0 as usize..(s.0 + s.1) as usize];
                let b = &blob[b.0 as usize..(b.0 + b.1) as usize];
                quant::dequant_row(&l, w, s, b, r, out);
            }
            _ => {
                let d = self.dtype();
                for (c, o) in out.iter_mut().enumerate().take(self.cols) {
                    *o = quant::read_float(w, d, r * self.cols + c);
                }
            }
        }
    }
}

/// `experts.json`: the blob layout, the same for every MoE layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayout {
    pub n_experts: usize,
    /// Bytes from one blob to the next (a multiple of [`BLOB_ALIGN`]).
    pub blob_stride: u64,
    /// Bytes of a blob actually used (≤ stride).
    pub blob_bytes: u64,
    pub parts: Vec<PartLayout>,
    /// Layer index → its file (relative path).
    pub layers: BTreeMap<usize, String>,
}

impl ExpertLayout {
    pub fn part(&self, role: &str) -> Option<&PartLayout> {
        self.parts.iter().find(|p| p.role == role)
    }

    /// Checks the layout against the model it claims to describe.
    pub fn check(&self, path: &Path, n_experts: usize, h: usize, iw: usize, n_layers: usize) -> Result<()> {
        let bad =
            |msg: String| Err(Error::Invalid(format!("{}: {msg}: reinstall with `kestrel install`", path.display())));
        if self.n_experts != n_experts {
            return bad(format!("{} experts, config.json has {n_experts}", self.n_experts));
        }
        if !self.blob_stride.is_multiple_of(BLOB_ALIGN) || self.blob_bytes > self.blob_stride {
            return bad(format!(
                "blob stride {} is not a page multiple holding {} bytes",
                self.blob_stride, self.blob_bytes
            ));
        }
        if self.layers.len() != n_layers || self.layers.keys().any(|&l| l >= n_layers) {
            return bad(format!("lists {} expert layer files, the model has {n_layers} MoE layers", self.layers.len()));
        }
        let fused = self.part("gate_up").is_some();
        let want: Vec<(&str, usize, usize)> = if fused {
            vec![("gate_up", 2 * iw, h), ("down", h, iw)]
        } else {
            vec![("gate", iw, h), ("up", iw, h), ("down", h, iw)]
        };
        if self.parts.len() != want.len() {
            return bad(format!("{} parts per expert, expected {}", self.parts.len(), want.len()));
        }
        for (role, rows, cols) in want {
            let Some(p) = self.part(role) else { return bad(format!("no `{role}` part")) };
            if p.rows != rows || p.cols != cols {
                return bad(format!("part `{role}` is {}x{}, config.json implies {rows}x{cols}", p.rows, p.cols));
            }
            let (wb, sb) = match p.bits() {
                Some(bits) => {
                    if p.group_size == 0 || cols % p.group_size != 0 {
                        return bad(format!("part `{role}` has group size {}", p.group_size));
                    }
                    (rows * cols * bits as usize / 8, Some(rows * cols / p.group_size * 2))
                }
                None => match p.format.as_str() {
                    "bf16" | "f16" => (rows * cols * 2, None),
                    "f32" => (rows * cols * 4, None),
                    f => return bad(format!("part `{role}` has unknown format `{f}`")),
                },
            };
            let spans = [Some(p.w), p.scales, p.biases];
            let sizes = [Some(wb), sb, sb];
            for (span, size) in spans.iter().zip(sizes) {
                match (span, size) {
                    (Some((off, len)), Some(n))
                        if *len == n as u64 && off % PART_ALIGN == 0 && off + len <= self.blob_bytes => {}
                    (None, None) => {}
                    _ => return bad(format!("part `{role}` has a malformed span {span:?} (expected {size:?} bytes)")),
                }
            }
        }
        Ok(())
    }
}

/// Lowercase hex SHA-256 of a whole file, read in 8 MiB pieces (bounded memory).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rejects a manifest path that could leave the directory.
fn safe_rel(dir: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if rel.is_empty() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::Invalid(format!(
            "{}: lists the path `{rel}`, which is not inside the installation",
            dir.join(MANIFEST).display()
        )));
    }
    Ok(dir.join(p))
}

/// Fails on the first symlink anywhere under `dir` (or `dir` itself): an installation is
/// verified by content, and a link could point it at files the manifest never vouched for.
pub fn reject_symlinks(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Error::io(dir, e))?;
    if meta.file_type().is_symlink() {
        return Err(Error::Invalid(format!(
            "{}: is a symbolic link; installations must be plain directories (copy it instead)",
            dir.display()
        )));
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            reject_symlinks(&entry.path())?;
        }
    }
    Ok(())
}

/// How much of an installation to re-hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Every file: `kestrel verify`.
    Full,
    /// Every file but the expert files (hashed by the streamer on first use): loading.
    Load,
    /// Small files only; large ones by size (`--trust-manifest`).
    Trust,
}

/// An opened, checked installation.
#[derive(Debug, Clone)]
pub struct Installation {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub layout: Option<ExpertLayout>,
}

impl Installation {
    /// True when `dir` looks like an installation (has a manifest), whatever its state.
    pub fn is_installation(dir: &Path) -> bool {
        std::fs::symlink_metadata(dir.join(MANIFEST)).is_ok()
    }

    /// Reads and checks `dir/manifest.json`: format and version, no symlinks, every listed file
    /// present with its size, and hashes as `check` says. Errors name the file and the fix.
    pub fn open(dir: &Path, check: Check, mut on_hashed: impl FnMut(u64)) -> Result<Self> {
        reject_symlinks(dir)?;
        let mpath = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&mpath).map_err(|e| Error::io(&mpath, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::config(&mpath, format!("not valid JSON: {e}")))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(Error::config(
                &mpath,
                format!("not a Kestrel installation manifest (field `format` is not \"{FORMAT}\")"),
            ));
        }
        match v.get("format_version").and_then(|f| f.as_u64()) {
            Some(n) if n == FORMAT_VERSION as u64 => {}
            Some(n) => {
                return Err(Error::config(&mpath, format!("format version {n} is not supported (this kestrel reads version {FORMAT_VERSION}): reinstall with this kestrel's `kestrel install`")))
            }
            None => return Err(Error::config(&mpath, "has no numeric `format_version`")),
        }
        let manifest: Manifest =
            serde_json::from_value(v).map_err(|e| Error::config(&mpath, format!("malformed manifest: {e}")))?;
        for f in &manifest.files {
            let path = safe_rel(dir, &f.path)?;
            let meta = std::fs::metadata(&path).map_err(|e| {
                Error::Invalid(format!(
                    "{}: listed in the manifest but unreadable ({e}): the installation is incomplete, reinstall it",
                    path.display()
                ))
            })?;
            if !meta.is_file() {
                return Err(Error::Invalid(format!("{}: not a regular file", path.display())));
            }
            if meta.len() != f.bytes {
                return Err(Error::Invalid(format!(
                    "{}: {} bytes, the manifest says {}: the file is truncated or replaced; reinstall it (kestrel install)",
                    path.display(),
                    meta.len(),
                    f.bytes
                )));
            }
        }
        for f in &manifest.files {
            let is_expert = f.path.starts_with(&format!("{EXPERT_DIR}/"));
            let hash = match check {
                Check::Full => true,
                Check::Load => !is_expert,
                Check::Trust => f.bytes <= LARGE_FILE && !is_expert,
            };
            if hash {
                check_hash(dir, f)?;
                on_hashed(f.bytes);
            }
        }
        let layout = if manifest.files.iter().any(|f| f.path == LAYOUT) {
            let lpath = dir.join(LAYOUT);
            let text = std::fs::read_to_string(&lpath).map_err(|e| Error::io(&lpath, e))?;
            let layout: ExpertLayout = serde_json::from_str(&text)
                .map_err(|e| Error::config(&lpath, format!("malformed expert layout: {e}")))?;
            for file in layout.layers.values() {
                let e = manifest.files.iter().find(|f| &f.path == file).ok_or_else(|| {
                    Error::config(&lpath, format!("names `{file}`, which the manifest does not list"))
                })?;
                let want = layout.n_experts as u64 * layout.blob_stride;
                if e.bytes != want {
                    return Err(Error::config(
                        &lpath,
                        format!(
                            "`{file}` holds {} bytes, {} experts at stride {} need {want}",
                            e.bytes, layout.n_experts, layout.blob_stride
                        ),
                    ));
                }
            }
            Some(layout)
        } else {
            None
        };
        Ok(Installation { dir: dir.to_path_buf(), manifest, layout })
    }

    pub fn entry(&self, rel: &str) -> Option<&FileEntry> {
        self.manifest.files.iter().find(|f| f.path == rel)
    }
}

/// Re-hashes one listed file; the error names it and says what to do.
pub fn check_hash(dir: &Path, f: &FileEntry) -> Result<()> {
    let path = safe_rel(dir, &f.path)?;
    let got = sha256_file(&path)?;
    if got != f.sha256 {
        return Err(Error::Invalid(format!(
            "{}: SHA-256 {got} does not match the manifest's {}: the file is damaged; reinstall (kestrel install) or restore it",
            path.display(),
            f.sha256
        )));
    }
    Ok(())
}

/// One layer's expert file.
struct LayerFile {
    path: PathBuf,
    file: File,
    entry: FileEntry,
}

/// The per-layer expert files of an installation, opened, hashed on first use.
pub struct ExpertFiles {
    pub layout: ExpertLayout,
    dir: PathBuf,
    layers: BTreeMap<usize, LayerFile>,
    /// Layers whose file has been hashed against the manifest (or all, with `--trust-manifest`).
    verified: Mutex<Vec<usize>>,
    trust: bool,
}

impl ExpertFiles {
    /// Opens the files `inst`'s layout names. With `trust`, files are never hashed (the manifest
    /// already checked their sizes).
    pub fn open(inst: &Installation, trust: bool) -> Result<Self> {
        let layout = inst
            .layout
            .clone()
            .ok_or_else(|| Error::Invalid(format!("{}: has no expert layout", inst.dir.display())))?;
        let mut layers = BTreeMap::new();
        for (&l, rel) in &layout.layers {
            let path = inst.dir.join(rel);
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            let entry = inst
                .entry(rel)
                .cloned()
                .ok_or_else(|| Error::Invalid(format!("{}: not listed in the manifest", path.display())))?;
            layers.insert(l, LayerFile { path, file, entry });
        }
        Ok(ExpertFiles { layout, dir: inst.dir.clone(), layers, verified: Mutex::new(Vec::new()), trust })
    }

    pub fn has_layer(&self, layer: usize) -> bool {
        self.layers.contains_key(&layer)
    }

    /// Hashes `layer`'s file against the manifest the first time it is used.
    pub fn ensure_verified(&self, layer: usize) -> Result<()> {
        if self.trust {
            return Ok(());
        }
        let mut v = self.verified.lock().expect("no panic holds this lock");
        if v.contains(&layer) {
            return Ok(());
        }
        let lf = self.file(layer)?;
        check_hash(&self.dir, &lf.entry)?;
        v.push(layer);
        Ok(())
    }

    fn file(&self, layer: usize) -> Result<&LayerFile> {
        self.layers
            .get(&layer)
            .ok_or_else(|| Error::Invalid(format!("layer {layer} has no expert file in this installation")))
    }

    /// Verifies `layer`'s file and hands every expert's blob to `f(expert, blob)` in order:
    /// loading all experts resident.
    pub fn for_each_expert(&self, layer: usize, mut f: impl FnMut(u32, &[u8]) -> Result<()>) -> Result<()> {
        self.ensure_verified(layer)?;
        let mut blob = Vec::new();
        for e in 0..self.layout.n_experts as u32 {
            self.read(layer, e, &mut blob)?;
            f(e, &blob)?;
        }
        Ok(())
    }

    /// Reads expert `expert` of `layer` (its used bytes) into `buf`. Call
    /// [`ensure_verified`](Self::ensure_verified) first.
    pub fn read(&self, layer: usize, expert: u32, buf: &mut Vec<u8>) -> Result<()> {
        let lf = self.file(layer)?;
        if expert as usize >= self.layout.n_experts {
            return Err(Error::Invalid(format!(
                "expert {expert} out of range (the layer has {})",
                self.layout.n_experts
            )));
        }
        buf.resize(self.layout.blob_bytes as usize, 0);
        lf.file.read_exact_at(buf, expert as u64 * self.layout.blob_stride).map_err(|e| {
            Error::Invalid(format!(
                "{}: reading expert {expert}: {e} (is the file truncated? `kestrel verify` the installation)",
                lf.path.display()
            ))
        })
    }
}
