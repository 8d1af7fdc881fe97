//! `kestrel install SRC DST`: repacks an HF or MLX checkpoint into the installed layout
//! (`crate::loader::installed`) so the routed experts can stream from per-layer files.
//!
//! Safety: everything is written under `DST.partial/`; each finished file is fsynced and recorded
//! with its SHA-256 in `DST.partial/.journal`. When all files exist, the manifest is written, the
//! whole directory is re-verified from disk, and only then renamed to `DST` (one atomic rename:
//! `DST` is either absent or complete). A rerun after an interruption keeps the journal's files
//! whose bytes still hash to what was recorded and redoes the rest.
//!
//! Memory: the source is read with positional reads, not through the mapping, so the heap holds at
//! most `workers × (blob stride + COPY_CHUNK)` bytes ([`InstallReport::heap_bound`]), whatever the
//! checkpoint's size.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::loader::installed::*;
use crate::loader::{ExpertGateUp, Matrix, ModelWeights, TensorRef, TensorStore};

/// Bytes per positional read when copying tensors.
pub const COPY_CHUNK: usize = 8 << 20;
const JOURNAL: &str = ".journal";

/// Options of one install run.
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    /// Parallel writers (expert layer files); 0 = available cores, at most 4.
    pub workers: usize,
    /// Test hook: fail after writing this many files, leaving the partial directory behind (as an
    /// interruption would).
    pub fail_after: Option<usize>,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

#[derive(Debug, Clone)]
pub struct InstallReport {
    pub manifest: Manifest,
    /// Files kept from an interrupted run (re-verified), and files written by this run.
    pub kept: usize,
    pub written: usize,
    /// Upper bound of the heap the copy used.
    pub heap_bound: u64,
}

/// One source tensor's rows for one expert: `bytes_per_expert` bytes at `file_offset +
/// e · bytes_per_expert` of `path`.
#[derive(Clone)]
struct Piece {
    path: PathBuf,
    offset: u64,
    per_expert: u64,
    /// Where it goes in the blob.
    blob_off: u64,
}

/// What one output file is made of.
enum Job {
    Copy(PathBuf),
    Bytes(Vec<u8>),
    Common { header: Vec<u8>, tensors: Vec<TensorRef> },
    Experts { n_experts: usize, stride: u64, blob_bytes: u64, pieces: Vec<Piece> },
}

impl Job {
    fn bytes(&self) -> Result<u64> {
        Ok(match self {
            Job::Copy(p) => fs::metadata(p).map_err(|e| Error::io(p, e))?.len(),
            Job::Bytes(b) => b.len() as u64,
            Job::Common { header, tensors } => {
                header.len() as u64 + tensors.iter().map(|t| t.bytes().len() as u64).sum::<u64>()
            }
            Job::Experts { n_experts, stride, .. } => *n_experts as u64 * stride,
        })
    }
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Per-expert slices of a stacked matrix: (values, scales, biases) tensors with their format.
fn matrix_tensors(m: &Matrix) -> (String, usize, Vec<TensorRef>) {
    match m {
        Matrix::Float { t, .. } => (m.format().to_string(), 0, vec![t.clone()]),
        Matrix::Quant { w, scales, biases, layout } => {
            (m.format().to_string(), layout.group_size, vec![w.clone(), scales.clone(), biases.clone()])
        }
    }
}

/// The expert parts of a MoE layer, with their role names, in blob order.
fn layer_parts(moe: &crate::loader::StackedExperts) -> Vec<(&'static str, &Matrix)> {
    match &moe.gate_up {
        ExpertGateUp::Fused(gu) => vec![("gate_up", gu), ("down", &moe.down)],
        ExpertGateUp::Split { gate, up } => vec![("gate", gate), ("up", up), ("down", &moe.down)],
    }
}

/// What an installation will hold: the expert layout (none for a dense model), one job per output
/// file (manifest excluded), the sizes and the architecture line the manifest records.
struct Plan {
    layout: Option<ExpertLayout>,
    jobs: Vec<(String, Job)>,
    sizes: Sizes,
    arch: String,
}

/// Plans the whole installation.
fn plan(src: &Path, cfg: &Config, store: &TensorStore, w: &ModelWeights) -> Result<Plan> {
    let t = &cfg.text;
    let e = t.num_experts;
    let mut expert_names: Vec<String> = Vec::new();
    let mut layout: Option<ExpertLayout> = None;
    let mut jobs: Vec<(String, Job)> = Vec::new();
    for (li, lw) in w.layers.iter().enumerate() {
        let Some(stacked) = lw.moe.as_ref().and_then(|m| m.experts.as_ref()) else { continue };
        let mut parts = Vec::new();
        let mut pieces = Vec::new();
        let mut cursor = 0u64;
        for (role, m) in layer_parts(stacked) {
            let (fmt, gs, tensors) = matrix_tensors(m);
            let mut spans = Vec::new();
            for tr in &tensors {
                let total = tr.bytes().len() as u64;
                if !total.is_multiple_of(e as u64) {
                    return Err(Error::Invalid(format!(
                        "{}: tensor `{}` ({total} bytes) does not split into {e} experts",
                        tr.path().display(),
                        tr.name
                    )));
                }
                let per = total / e as u64;
                let off = align(cursor, PART_ALIGN);
                spans.push((off, per));
                pieces.push(Piece {
                    path: tr.path().to_path_buf(),
                    offset: tr.file_offset(),
                    per_expert: per,
                    blob_off: off,
                });
                expert_names.push(tr.name.clone());
                cursor = off + per;
            }
            parts.push(PartLayout {
                role: role.into(),
                format: fmt,
                group_size: gs,
                rows: m.rows() / e,
                cols: m.cols(),
                w: spans[0],
                scales: spans.get(1).copied(),
                biases: spans.get(2).copied(),
            });
        }
        let stride = align(cursor, BLOB_ALIGN);
        let file = layer_file(li);
        match &mut layout {
            None => {
                layout = Some(ExpertLayout {
                    n_experts: e,
                    blob_stride: stride,
                    blob_bytes: cursor,
                    parts,
                    layers: BTreeMap::new(),
                });
            }
            Some(l) => {
                if l.parts != parts || l.blob_stride != stride {
                    return Err(Error::Invalid(format!("layer {li}: its experts are stored unlike layer 0's (format or shape): Kestrel needs one blob layout per model")));
                }
            }
        }
        if let Some(l) = &mut layout {
            l.layers.insert(li, file.clone());
        }
        jobs.push((file, Job::Experts { n_experts: e, stride, blob_bytes: cursor, pieces }));
    }

    // common.safetensors: every other tensor, sorted by name, bytes unchanged.
    let mut names: Vec<&String> = store.names().filter(|n| !expert_names.contains(n)).collect();
    names.sort();
    let mut header = serde_json::Map::new();
    let mut tensors = Vec::new();
    let mut off = 0u64;
    for n in names {
        let tr = store.get(n).expect("listed by the store");
        let len = tr.bytes().len() as u64;
        header.insert(
            n.clone(),
            serde_json::json!({ "dtype": tr.dtype_name(), "shape": tr.shape(), "data_offsets": [off, off + len] }),
        );
        off += len;
        tensors.push(tr);
    }
    let mut hbytes = serde_json::to_vec(&serde_json::Value::Object(header)).expect("JSON of strings and numbers");
    while !hbytes.len().is_multiple_of(8) {
        hbytes.push(b' ');
    }
    let mut head = (hbytes.len() as u64).to_le_bytes().to_vec();
    head.extend(hbytes);
    let common_bytes = head.len() as u64 + off;
    jobs.push((COMMON.into(), Job::Common { header: head, tensors }));
    jobs.push((CONFIG.into(), Job::Copy(src.join(CONFIG))));
    for f in SIDE_FILES {
        let p = src.join(f);
        if p.is_file() {
            jobs.push((f.to_string(), Job::Copy(p)));
        }
    }
    if let Some(l) = &layout {
        let mut text = serde_json::to_vec_pretty(l).expect("layout serialises");
        text.push(b'\n');
        jobs.push((LAYOUT.into(), Job::Bytes(text)));
    }
    let n_moe = layout.as_ref().map_or(0, |l| l.layers.len());
    let stride = layout.as_ref().map_or(0, |l| l.blob_stride);
    let sizes = Sizes {
        common_bytes,
        expert_bytes: n_moe as u64 * e as u64 * stride,
        n_moe_layers: n_moe,
        n_experts: if n_moe > 0 { e } else { 0 },
        top_k: if n_moe > 0 { t.top_k_experts } else { 0 },
        expert_stride: stride,
    };
    let arch = if n_moe > 0 {
        format!(
            "gemma4 ({} layers, hidden {}, {} experts top-{})",
            t.num_hidden_layers, t.hidden_size, e, t.top_k_experts
        )
    } else {
        format!("gemma4 ({} layers, hidden {}, dense)", t.num_hidden_layers, t.hidden_size)
    };
    Ok(Plan { layout, jobs, sizes, arch })
}

/// Writes one job's file, returning its size and SHA-256. `progress` is told of every byte.
fn write_job(job: &Job, path: &Path, progress: &dyn Fn(u64)) -> Result<(u64, String)> {
    let mut out = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut total = 0u64;
    let mut emit = |out: &mut File, bytes: &[u8]| -> Result<()> {
        out.write_all(bytes).map_err(|e| Error::io(path, e))?;
        h.update(bytes);
        total += bytes.len() as u64;
        progress(bytes.len() as u64);
        Ok(())
    };
    let read_at =
        |file: &File, src: &Path, buf: &mut [u8], off: u64| file.read_exact_at(buf, off).map_err(|e| Error::io(src, e));
    match job {
        Job::Copy(src) => {
            let bytes = fs::read(src).map_err(|e| Error::io(src, e))?;
            emit(&mut out, &bytes)?;
        }
        Job::Bytes(b) => emit(&mut out, b)?,
        Job::Common { header, tensors } => {
            emit(&mut out, header)?;
            let mut buf = vec![0u8; COPY_CHUNK];
            let mut open: Option<(PathBuf, File)> = None;
            for t in tensors {
                if open.as_ref().map(|(p, _)| p.as_path()) != Some(t.path()) {
                    let f = File::open(t.path()).map_err(|e| Error::io(t.path(), e))?;
                    open = Some((t.path().to_path_buf(), f));
                }
                let (_, f) = open.as_ref().expect("just opened");
                let len = t.bytes().len() as u64;
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(COPY_CHUNK as u64) as usize;
                    read_at(f, t.path(), &mut buf[..n], t.file_offset() + done)?;
                    emit(&mut out, &buf[..n])?;
                    done += n as u64;
                }
            }
        }
        Job::Experts { n_experts, stride, blob_bytes, pieces } => {
            let mut files: BTreeMap<&Path, File> = BTreeMap::new();
            for p in pieces {
                if !files.contains_key(p.path.as_path()) {
                    files.insert(&p.path, File::open(&p.path).map_err(|e| Error::io(&p.path, e))?);
                }
            }
            let mut blob = vec![0u8; *stride as usize];
            for e in 0..*n_experts as u64 {
                blob.fill(0);
                for p in pieces {
                    let dst = &mut blob[p.blob_off as usize..(p.blob_off + p.per_expert) as usize];
                    read_at(&files[p.path.as_path()], &p.path, dst, p.offset + e * p.per_expert)?;
                }
                debug_assert!(*blob_bytes <= *stride);
                emit(&mut out, &blob)?;
            }
        }
    }
    out.sync_all().map_err(|e| Error::io(path, e))?;
    Ok((total, hex(&h.finalize())))
}

/// A fingerprint of the source: a journal from another source (or another layout version) is
/// not resumed.
fn fingerprint(src: &Path, jobs: &[(String, Job)]) -> Result<String> {
    let mut h = Sha256::new();
    h.update(format!("{FORMAT} v{FORMAT_VERSION}\n").as_bytes());
    h.update(fs::read(src.join(CONFIG)).map_err(|e| Error::io(src.join(CONFIG), e))?);
    for (path, job) in jobs {
        h.update(format!("{path} {}\n", job.bytes()?).as_bytes());
    }
    Ok(hex(&h.finalize()))
}

/// Reads the journal of an interrupted run: path → (bytes, sha256), only if it was made for the
/// same source.
fn read_journal(partial: &Path, fp: &str) -> BTreeMap<String, (u64, String)> {
    let mut done = BTreeMap::new();
    let Ok(text) = fs::read_to_string(partial.join(JOURNAL)) else { return done };
    let mut lines = text.lines();
    if lines.next() != Some(&format!("source {fp}")) {
        return done;
    }
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        if let [path, bytes, sha] = f[..] {
            if let Ok(b) = bytes.parse() {
                done.insert(path.to_string(), (b, sha.to_string()));
            }
        }
    }
    done
}

/// Installs `src` into `dst`. See the module docs for the guarantees.
pub fn install(src: &Path, dst: &Path, opts: &InstallOptions) -> Result<InstallReport> {
    if Installation::is_installation(src) {
        return Err(Error::Invalid(format!(
            "{}: is already an installation (has {MANIFEST}); run it directly or `kestrel verify` it",
            src.display()
        )));
    }
    if fs::symlink_metadata(dst).is_ok() {
        return Err(Error::Invalid(format!(
            "{}: already exists; choose a new directory (or `kestrel verify` the existing one)",
            dst.display()
        )));
    }
    let name = dst
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{}: not a usable destination directory name", dst.display())))?;
    let partial = dst.with_file_name(format!("{}.partial", name.to_string_lossy()));
    let cfg = Config::from_file(&src.join(CONFIG))?;
    let store = TensorStore::open_dir(src)?;
    // Loading checks every tensor's name, dtype and shape before a byte is written.
    let weights = ModelWeights::load(&store, &cfg)?;
    let Plan { layout, jobs, sizes, arch } = plan(src, &cfg, &store, &weights)?;
    let fp = fingerprint(src, &jobs)?;

    // Resume: keep journal entries whose file still has the recorded size and hash.
    let recorded = read_journal(&partial, &fp);
    if recorded.is_empty() && partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| Error::io(&partial, e))?;
    }
    fs::create_dir_all(partial.join(EXPERT_DIR)).map_err(|e| Error::io(&partial, e))?;
    let total: u64 = jobs.iter().map(|(_, j)| j.bytes()).sum::<Result<u64>>()?;
    let bar = progress_bar(opts.progress, total, "installing");
    let mut entries: BTreeMap<String, FileEntry> = BTreeMap::new();
    let mut todo = Vec::new();
    for (path, job) in jobs {
        if let Some((bytes, sha)) = recorded.get(&path) {
            let e = FileEntry { path: path.clone(), bytes: *bytes, sha256: sha.clone() };
            let on_disk = fs::metadata(partial.join(&path)).map(|m| m.len()).ok();
            if on_disk == Some(*bytes) && check_hash(&partial, &e).is_ok() && job.bytes()? == *bytes {
                bar.inc(*bytes);
                entries.insert(path, e);
                continue;
            }
        }
        todo.push((path, job));
    }
    let kept = entries.len();
    // The journal is rewritten with the kept entries; new ones are appended as files finish.
    let mut journal_text = format!("source {fp}\n");
    for e in entries.values() {
        journal_text.push_str(&format!("{}\t{}\t{}\n", e.path, e.bytes, e.sha256));
    }
    fs::write(partial.join(JOURNAL), &journal_text).map_err(|e| Error::io(partial.join(JOURNAL), e))?;
    let journal = Mutex::new(
        OpenOptions::new().append(true).open(partial.join(JOURNAL)).map_err(|e| Error::io(partial.join(JOURNAL), e))?,
    );

    let workers = match (opts.fail_after, opts.workers) {
        (Some(_), _) => 1,
        (None, 0) => std::thread::available_parallelism().map_or(2, |n| n.get()).min(4),
        (None, n) => n,
    };
    let next = AtomicUsize::new(0);
    let written = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Result<FileEntry>>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, job)) = todo.get(i) else { return };
                if let Some(limit) = opts.fail_after {
                    if written.load(Ordering::Relaxed) >= limit {
                        stop.store(true, Ordering::Relaxed);
                        results.lock().expect("no panics hold it").push(Err(Error::Invalid(format!(
                            "install stopped after {limit} files (--fail-after test hook); rerun to resume"
                        ))));
                        return;
                    }
                }
                let r = write_job(job, &partial.join(path), &|n| bar.inc(n)).and_then(|(bytes, sha)| {
                    let line = format!("{path}\t{bytes}\t{sha}\n");
                    let mut j = journal.lock().expect("no panics hold it");
                    j.write_all(line.as_bytes())
                        .and_then(|_| j.sync_data())
                        .map_err(|e| Error::io(partial.join(JOURNAL), e))?;
                    written.fetch_add(1, Ordering::Relaxed);
                    Ok(FileEntry { path: path.clone(), bytes, sha256: sha })
                });
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                results.lock().expect("no panics hold it").push(r);
            });
        }
    });
    bar.finish_and_clear();
    for r in results.into_inner().expect("threads joined") {
        let e = r?;
        entries.insert(e.path.clone(), e);
    }

    let manifest = Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        architecture: arch,
        sizes,
        files: entries.into_values().collect(),
    };
    let mut text = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
    text.push(b'\n');
    let tmp = partial.join(format!("{MANIFEST}.tmp"));
    fs::write(&tmp, &text).map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, partial.join(MANIFEST)).map_err(|e| Error::io(&tmp, e))?;
    fs::remove_file(partial.join(JOURNAL)).map_err(|e| Error::io(partial.join(JOURNAL), e))?;
    // Re-read everything from disk before the rename makes it visible.
    let vbar = progress_bar(opts.progress, total, "verifying");
    let opened = Installation::open(&partial, Check::Full, |n| vbar.inc(n));
    vbar.finish_and_clear();
    let opened = opened?;
    if let Some(l) = &layout {
        l.check(
            &partial.join(LAYOUT),
            cfg.text.num_experts,
            cfg.text.hidden_size,
            cfg.text.moe_intermediate_size,
            l.layers.len(),
        )?;
    }
    File::open(&partial).and_then(|d| d.sync_all()).map_err(|e| Error::io(&partial, e))?;
    fs::rename(&partial, dst).map_err(|e| Error::io(dst, e))?;
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        // Make the rename itself durable.
        let _ = File::open(parent).and_then(|d| d.sync_all());
    }
    let blob = layout.as_ref().map_or(0, |l| l.blob_stride);
    Ok(InstallReport {
        manifest: opened.manifest,
        kept,
        written: written.into_inner(),
        heap_bound: workers as u64 * (blob + COPY_CHUNK as u64),
    })
}

/// Re-checks every file of an installation (`kestrel verify`).
pub fn verify(dir: &Path, progress: bool) -> Result<Installation> {
    let total = fs::read_to_string(dir.join(MANIFEST))
        .ok()
        .and_then(|t| serde_json::from_str::<Manifest>(&t).ok())
        .map_or(0, |m| m.files.iter().map(|f| f.bytes).sum());
    let bar = progress_bar(progress, total, "verifying");
    let r = Installation::open(dir, Check::Full, |n| bar.inc(n));
    bar.finish_and_clear();
    let inst = r?;
    let cfg = Config::from_file(&dir.join(CONFIG))?;
    if let Some(l) = &inst.layout {
        let t = &cfg.text;
        let n_moe = if t.enable_moe_block { cfg.layers.len() } else { 0 };
        l.check(&dir.join(LAYOUT), t.num_experts, t.hidden_size, t.moe_intermediate_size, n_moe)?;
    }
    // The common weights must load: names, dtypes and shapes against config.json.
    let store = TensorStore::open_files(&[dir.join(COMMON)])?;
    ModelWeights::load_with(&store, &cfg, false)?;
    Ok(inst)
}

fn progress_bar(on: bool, total: u64, what: &str) -> indicatif::ProgressBar {
    if !on {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    let style = indicatif::ProgressStyle::with_template(
        "{msg:>10} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .expect("static template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}
