//! The `kestrel` binary end to end: every bad input fails fast with exit code 2, nothing on
//! stdout and one `error: ...` line on stderr that names the problem (never a panic or a hang);
//! good inputs print what the `--json` contract promises and reproduce the transformers ids.
//!
//! Broken models are built in temp directories from copies of the fixtures. Runs that do not
//! depend on the backend use `--backend cpu` (fast); the wgpu ones follow tests/common's
//! no-adapter rule (skip loudly, fail under KESTREL_REQUIRE_GPU=1).

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const BIN: &str = env!("CARGO_BIN_EXE_kestrel");
/// No run may take longer than this (a hang is a failure, not a slow test).
const HANG: Duration = Duration::from_secs(60);
/// `kestrel bench`'s bound (its test asks for it): it runs tens of decode steps (warm-up, pp and
/// tg repetitions, two profiles, the verify-cost table), and a tiny-model step takes ≈ 0.2 s on
/// lavapipe in a debug build, attention_short's 1024-thread workgroups emulated on the CPU:
/// ≈ 39 s alone on two cores, past 60 s beside the other CLI tests (a CI run, 2026-12-05).
const BENCH_HANG: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------------
// Running the binary

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kestrel")
}

/// Waits for `child` at most `limit`, killing it (and failing) if it runs longer.
fn wait_bounded(child: &mut Child, what: &str, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`kestrel {what}` did not finish within {limit:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    })
}

fn run(args: &[&str]) -> Out {
    run_within(args, HANG)
}

/// `run` with another bound than `HANG`.
fn run_within(args: &[&str], limit: Duration) -> Out {
    let what = args.join(" ");
    let mut child = spawn(args);
    // Read both pipes on threads so a chatty child can never block on a full pipe.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = wait_bounded(&mut child, &what, limit);
    Out { code: status.code(), stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

fn no_panic(o: &Out, what: &str) {
    assert!(!o.stderr.contains("panicked") && !o.stderr.contains("RUST_BACKTRACE"), "`{what}` panicked:\n{}", o.stderr);
    assert_ne!(o.code, Some(101), "`{what}` exited with the panic code 101:\n{}", o.stderr);
}

/// A failure of ours: exit 2, empty stdout, exactly one `error: ...` line naming every `needles`.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let what = args.join(" ");
    let o = run(args);
    no_panic(&o, &what);
    assert_eq!(o.code, Some(2), "`{what}`: exit code {:?}, stderr:\n{}", o.code, o.stderr);
    assert!(o.stdout.is_empty(), "`{what}`: stdout not empty: {:?}", o.stdout);
    let err = o.stderr.trim_end();
    assert!(err.starts_with("error: "), "`{what}`: stderr does not start with `error: `:\n{err}");
    assert_eq!(err.lines().count(), 1, "`{what}`: error is not one line:\n{err}");
    for n in needles {
        assert!(err.contains(n), "`{what}`: error does not mention `{n}`:\n{err}");
    }
    eprintln!("kestrel {what}\n  -> {err}");
    err.to_string()
}

/// A usage error reported by clap: exit 2, empty stdout, first line `error: ...` naming `needles`
/// (clap adds a usage hint after it).
fn usage_fails(args: &[&str], needles: &[&str]) -> String {
    let what = args.join(" ");
    let o = run(args);
    no_panic(&o, &what);
    assert_eq!(o.code, Some(2), "`{what}`: exit code {:?}, stderr:\n{}", o.code, o.stderr);
    assert!(o.stdout.is_empty(), "`{what}`: stdout not empty: {:?}", o.stdout);
    let first = o.stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "`{what}`: stderr does not start with `error: `:\n{}", o.stderr);
    for n in needles {
        assert!(first.contains(n), "`{what}`: error does not mention `{n}`:\n{}", o.stderr);
    }
    o.stderr
}

/// A successful run; None when it is a wgpu run and no adapter exists (skipped, tests/common rule).
fn succeeds(args: &[&str]) -> Option<Out> {
    succeeds_within(args, HANG)
}

/// `succeeds` with another bound than `HANG`.
fn succeeds_within(args: &[&str], limit: Duration) -> Option<Out> {
    let what = args.join(" ");
    let o = run_within(args, limit);
    no_panic(&o, &what);
    if o.code != Some(0) && o.stderr.contains("no GPU adapter") && !common::gpu_required() {
        eprintln!("skipped `{what}`: no adapter ({})", o.stderr.trim());
        return None;
    }
    assert_eq!(o.code, Some(0), "`{what}` failed:\n{}", o.stderr);
    Some(o)
}

fn json_of(o: &Out) -> serde_json::Value {
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "--json must print exactly one line, got:\n{}", o.stdout);
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("stdout is one JSON object");
    assert!(v.is_object());
    v
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v["tokens"].as_array().expect("tokens is a list").iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn id_list(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn prompt(name: &str) -> Vec<u32> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("prompts.json")).unwrap()).unwrap();
    let p = v.as_array().unwrap().iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no prompt {name}"));
    p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

// ---------------------------------------------------------------------------------------------
// Broken models

/// A copy of a fixture directory, removed on drop.
struct TempModel {
    dir: PathBuf,
}

impl TempModel {
    fn copy(model: &str, form: &str, tag: &str) -> Self {
        let src = common::fixtures().join(model).join(form);
        let dir = std::env::temp_dir().join(format!("kestrel-cli-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        TempModel { dir }
    }
    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
    fn s(&self) -> &str {
        self.dir.to_str().unwrap()
    }
    /// Replaces the first occurrence of `from` in `file` (which must contain it).
    fn edit(&self, file: &str, from: &str, to: &str) {
        let p = self.path(file);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(from), "{file} does not contain {from}");
        std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    }
    /// Rewrites a safetensors file after `f` changed its tensor list (a valid file again).
    fn rewrite_tensors(&self, file: &str, f: impl FnOnce(&mut Vec<Tensor>)) {
        let p = self.path(file);
        let bytes = std::fs::read(&p).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<Tensor> = st
            .tensors()
            .into_iter()
            .map(|(name, v)| Tensor { name, dtype: v.dtype(), shape: v.shape().to_vec(), data: v.data().to_vec() })
            .collect();
        f(&mut tensors);
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|t| (t.name.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.data).expect("consistent tensor")))
            .collect();
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        std::fs::write(&p, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    }
}

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn find<'a>(ts: &'a mut [Tensor], suffix: &str) -> &'a mut Tensor {
    ts.iter_mut().find(|t| t.name.ends_with(suffix)).unwrap_or_else(|| panic!("no tensor *{suffix}"))
}

/// Length of the JSON header of a safetensors file.
fn header_len(p: &Path) -> usize {
    let b = std::fs::read(p).unwrap();
    u64::from_le_bytes(b[..8].try_into().unwrap()) as usize
}

fn truncate(p: &Path, len: usize) {
    let b = std::fs::read(p).unwrap();
    assert!(len < b.len());
    std::fs::write(p, &b[..len]).unwrap();
}

/// `generate` on a model directory, cpu backend, a short id prompt.
fn gen_on(dir: &str) -> Vec<&str> {
    vec!["generate", "--model", dir, "--backend", "cpu", "--prompt-ids", "2,105,3", "--max-new", "2"]
}

// ---------------------------------------------------------------------------------------------
// Bad checkpoints

#[test]
fn missing_safetensors() {
    let m = TempModel::copy("tiny-e2b", "hf", "missing-st");
    std::fs::remove_file(m.path("model.safetensors")).unwrap();
    fails(&gen_on(m.s()), &["loading model", "no model.safetensors", "model directory"]);
}

#[test]
fn truncated_in_data() {
    let m = TempModel::copy("tiny-e2b", "hf", "trunc-data");
    let p = m.path("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len() as usize;
    truncate(&p, len / 2);
    fails(&gen_on(m.s()), &["model.safetensors", "truncated"]);
}

#[test]
fn truncated_in_header() {
    let m = TempModel::copy("tiny-e2b", "hf", "trunc-header");
    let p = m.path("model.safetensors");
    truncate(&p, 8 + header_len(&p) / 2);
    fails(&gen_on(m.s()), &["model.safetensors", "truncated"]);
    truncate(&p, 5); // not even the 8-byte length
    fails(&gen_on(m.s()), &["model.safetensors", "truncated"]);
}

#[test]
fn garbage_safetensors() {
    let m = TempModel::copy("tiny-e2b", "hf", "garbage");
    let p = m.path("model.safetensors");
    // Text: the "header length" read from it is absurdly large.
    std::fs::write(&p, "this is not a safetensors file, just some text that happens to be long".repeat(100)).unwrap();
    fails(&gen_on(m.s()), &["model.safetensors", "not a safetensors file"]);
    // A plausible length followed by bytes that are not JSON.
    let mut b = 64u64.to_le_bytes().to_vec();
    b.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    std::fs::write(&p, &b).unwrap();
    fails(&gen_on(m.s()), &["model.safetensors", "not a safetensors file"]);
}

#[test]
fn tensor_removed() {
    let m = TempModel::copy("tiny-e2b", "hf", "removed");
    m.rewrite_tensors("model.safetensors", |ts| ts.retain(|t| !t.name.ends_with("layers.3.self_attn.q_proj.weight")));
    fails(&gen_on(m.s()), &["missing tensor", "layers.3.self_attn.q_proj.weight"]);
    // No embedding table at all: not a Gemma 4 checkpoint.
    m.rewrite_tensors("model.safetensors", |ts| ts.retain(|t| !t.name.ends_with("embed_tokens.weight")));
    fails(&gen_on(m.s()), &["missing tensor", "embed_tokens.weight"]);
}

#[test]
fn tensor_wrong_shape() {
    let m = TempModel::copy("tiny-e2b", "hf", "shape");
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.2.self_attn.k_proj.weight");
        assert_eq!(t.shape, [32, 128]);
        t.shape = vec![128, 32];
    });
    fails(&gen_on(m.s()), &["layers.2.self_attn.k_proj.weight", "[128, 32]", "[32, 128]", "shape"]);
}

#[test]
fn quantised_tensor_wrong_shape() {
    let m = TempModel::copy("tiny-e2b", "mlx-4bit", "qshape");
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.1.mlp.up_proj.weight");
        let n: usize = t.shape.iter().product();
        t.shape = vec![n]; // flattened: rank 1 instead of [rows, packed]
    });
    fails(&gen_on(m.s()), &["layers.1.mlp.up_proj.weight", "shape"]);
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.1.mlp.up_proj.weight");
        t.shape = vec![];
        t.data.truncate(4); // a scalar
    });
    fails(&gen_on(m.s()), &["layers.1.mlp.up_proj.weight", "shape"]);
}

#[test]
fn tensor_wrong_dtype() {
    let m = TempModel::copy("tiny-e2b", "hf", "dtype");
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.0.input_layernorm.weight");
        t.dtype = Dtype::I64;
        t.data = vec![0u8; t.shape[0] * 8];
    });
    fails(&gen_on(m.s()), &["layers.0.input_layernorm.weight", "dtype", "I64", "BF16"]);
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.0.input_layernorm.weight");
        t.dtype = Dtype::U8;
        t.data = vec![0u8; t.shape[0]];
    });
    fails(&gen_on(m.s()), &["layers.0.input_layernorm.weight", "dtype", "U8", "BF16"]);
    // A matrix as F64.
    let m = TempModel::copy("tiny-e2b", "hf", "dtype-f64");
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.0.mlp.up_proj.weight");
        t.dtype = Dtype::F64;
        t.data = vec![0u8; t.shape.iter().product::<usize>() * 8];
    });
    fails(&gen_on(m.s()), &["layers.0.mlp.up_proj.weight", "dtype", "F64"]);
}

#[test]
fn quantised_tensor_wrong_dtype() {
    let m = TempModel::copy("tiny-e2b", "mlx-4bit", "qdtype");
    m.rewrite_tensors("model.safetensors", |ts| {
        let t = find(ts, "layers.4.self_attn.o_proj.scales");
        assert_eq!(t.dtype, Dtype::BF16);
        t.dtype = Dtype::F16;
    });
    fails(&gen_on(m.s()), &["layers.4.self_attn.o_proj.scales", "dtype", "F16", "BF16"]);
}

#[test]
fn shard_missing() {
    let m = TempModel::copy("tiny-e2b", "mlx-4bit", "shard");
    m.edit(
        "model.safetensors.index.json",
        "\"language_model.model.layers.0.mlp.down_proj.biases\": \"model.safetensors\"",
        "\"language_model.model.layers.0.mlp.down_proj.biases\": \"model-00002-of-00002.safetensors\"",
    );
    fails(&gen_on(m.s()), &["model-00002-of-00002.safetensors", "model.safetensors.index.json", "shard"]);
}

#[test]
fn index_not_json() {
    let m = TempModel::copy("tiny-e2b", "mlx-4bit", "index-json");
    std::fs::write(m.path("model.safetensors.index.json"), "{\"weight_map\": ").unwrap();
    fails(&gen_on(m.s()), &["model.safetensors.index.json", "not valid JSON"]);
}

// ---------------------------------------------------------------------------------------------
// Bad configs

#[test]
fn config_not_json() {
    let m = TempModel::copy("tiny-e2b", "hf", "cfg-json");
    std::fs::write(m.path("config.json"), "model_type: gemma4\n").unwrap();
    fails(&gen_on(m.s()), &["config.json", "not valid JSON"]);
    std::fs::remove_file(m.path("config.json")).unwrap();
    fails(&gen_on(m.s()), &["config.json"]);
}

#[test]
fn config_unsupported_values() {
    let cases = [
        ("\"gelu_pytorch_tanh\"", "\"silu\"", &["hidden_activation", "silu"][..]),
        ("\"proportional\"", "\"yarn\"", &["rope_type", "yarn"][..]),
        ("\"model_type\": \"gemma4\"", "\"model_type\": \"llama\"", &["model_type", "llama", "Gemma 4"][..]),
    ];
    for (i, (from, to, needles)) in cases.iter().enumerate() {
        let m = TempModel::copy("tiny-e2b", "hf", &format!("cfg-unsup-{i}"));
        m.edit("config.json", from, to);
        let mut n = vec!["config.json"];
        n.extend_from_slice(needles);
        fails(&gen_on(m.s()), &n);
    }
}

#[test]
fn config_disagrees_with_weights() {
    let m = TempModel::copy("tiny-e2b", "hf", "cfg-hidden");
    m.edit("config.json", "\"hidden_size\": 128", "\"hidden_size\": 256");
    fails(&gen_on(m.s()), &["embed_tokens.weight", "[512, 128]", "[512, 256]", "config.json"]);
    let m = TempModel::copy("tiny-e2b", "mlx-4bit", "cfg-hidden-q");
    m.edit("config.json", "\"hidden_size\": 128", "\"hidden_size\": 256");
    fails(&gen_on(m.s()), &["embed_tokens.weight", "config.json"]);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

#[test]
fn prompt_longer_than_context() {
    let ids = id_list(&prompt("long"));
    assert_eq!(ids.split(',').count(), 40);
    fails(
        &["generate", "--backend", "cpu", "--ctx", "16", "--prompt-ids", &ids, "--max-new", "4"],
        &["40 tokens", "context of 16", "--ctx"],
    );
}

#[test]
fn prompt_id_outside_vocab() {
    fails(&["generate", "--backend", "cpu", "--prompt-ids", "2,512", "--max-new", "2"], &["512", "vocabulary", "512)"]);
    fails(&["generate", "--backend", "cpu", "--prompt-ids", "2,4294967295"], &["4294967295", "vocabulary"]);
    usage_fails(&["generate", "--backend", "cpu", "--prompt-ids", "2,x"], &["--prompt-ids", "x"]);
    usage_fails(&["generate", "--backend", "cpu", "--prompt-ids", "2,-1"], &["-1"]);
}

#[test]
fn unknown_backend() {
    usage_fails(&["generate", "--backend", "foo", "--prompt", "hi"], &["--backend", "foo", "wgpu", "cpu"]);
}

#[test]
fn unknown_flag() {
    usage_fails(&["generate", "--bogus", "--prompt", "hi"], &["--bogus"]);
    usage_fails(&["frobnicate"], &["frobnicate"]);
}

#[test]
fn model_path_not_a_dir() {
    let nope = std::env::temp_dir().join(format!("kestrel-cli-{}-nope", std::process::id()));
    fails(&gen_on(nope.to_str().unwrap()), &["--model", nope.to_str().unwrap(), "does not exist"]);
    let file = common::fixtures().join("tiny-e2b/hf/config.json");
    fails(&gen_on(file.to_str().unwrap()), &["--model", "config.json", "not a directory"]);
    // A directory, but not a model.
    let empty = TempModel { dir: std::env::temp_dir().join(format!("kestrel-cli-{}-empty", std::process::id())) };
    std::fs::create_dir_all(&empty.dir).unwrap();
    fails(&gen_on(empty.s()), &["config.json"]);
}

#[test]
fn messages_file_not_a_list() {
    let dir = std::env::temp_dir().join(format!("kestrel-cli-{}-msgs", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[&str]); 4] = [
        (r#"{"role": "user", "content": "hi"}"#, &["list", "object"]),
        ("[{\"role\": \"user\"", &["not valid JSON"]),
        (r#"[{"role": 3, "content": "hi"}]"#, &["role"]),
        (r#"["hi"]"#, &["message 0"]),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let f = dir.join(format!("m{i}.json"));
        std::fs::write(&f, text).unwrap();
        let mut n = vec!["m", ".json"];
        n.extend_from_slice(needles);
        fails(&["generate", "--backend", "cpu", "--messages-file", f.to_str().unwrap()], &n);
    }
    fails(
        &["generate", "--backend", "cpu", "--messages-file", dir.join("absent.json").to_str().unwrap()],
        &["absent.json"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sampling_values() {
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--temp", "-1"], &["--temp", "-1"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--temp=-1"], &["--temp", "-1"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--temp", "NaN"], &["--temp"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--top-p", "0"], &["--top-p"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--repetition-penalty", "-2"], &["--repetition-penalty"]);
    usage_fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--temp", "hot"], &["--temp", "hot"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--chunk", "0"], &["--chunk"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--ctx", "0"], &["context of 0"]);
    fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--ctx", "100000"], &["--ctx", "4096"]);
}

#[test]
fn no_prompt() {
    fails(&["generate", "--backend", "cpu"], &["no prompt", "--prompt"]);
    usage_fails(&["generate", "--backend", "cpu", "--prompt-ids", ""], &["--prompt-ids"]);
    fails(&["generate", "--backend", "cpu", "--raw"], &["--raw"]);
    usage_fails(&["generate", "--backend", "cpu", "--prompt", "hi", "--prompt-ids", "2"], &["--prompt"]);
}

#[test]
fn no_tokenizer_needs_prompt_ids() {
    let m = TempModel::copy("tiny-e2b", "hf", "no-tok");
    std::fs::remove_file(m.path("tokenizer.json")).unwrap();
    fails(&["generate", "--model", m.s(), "--backend", "cpu", "--prompt", "hi"], &["tokenizer.json", "--prompt-ids"]);
    // With ids, it runs and prints the ids.
    let o = succeeds(&["generate", "--model", m.s(), "--backend", "cpu", "--prompt-ids", "2,105", "--max-new", "3"])
        .unwrap();
    assert_eq!(o.stdout.split_whitespace().count(), 3, "{}", o.stdout);
}

// ---------------------------------------------------------------------------------------------
// Good inputs

fn check_json(v: &serde_json::Value, n: usize) {
    assert_eq!(ids_of(v).len(), n);
    assert!(v["text"].is_string());
    let s = &v["stats"];
    for k in ["prompt_tokens", "generated_tokens", "decode_tok_s", "peak_rss_bytes"] {
        assert!(s.get(k).is_some(), "stats lack {k}: {s}");
    }
    assert_eq!(s["generated_tokens"], n);
}

/// The README's first command, as a newcomer runs it: the generated text on stdout and the stats
/// line on stderr, nothing else — also without a desktop session (`XDG_RUNTIME_DIR` unset, where
/// Mesa's device-select layer once printed a Wayland error twice while adapters were enumerated).
#[test]
fn first_command_prints_only_the_text_and_the_stats_line() {
    let child = Command::new(BIN)
        .args(["generate", "--prompt", "Tell me about kestrels."])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kestrel");
    let mut child = child;
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = wait_bounded(&mut child, "generate with the embedded model", HANG);
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    if status.code() != Some(0) && stderr.contains("no GPU adapter") && !common::gpu_required() {
        eprintln!("skipped: no adapter ({})", stderr.trim());
        return;
    }
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stdout.trim().is_empty() && stdout.ends_with('\n'), "stdout: {stdout:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "stderr holds more than the stats line:\n{stderr}");
    assert!(lines[0].starts_with("[wgpu on ") && lines[0].contains("tok/s"), "not the stats line: {}", lines[0]);
}

/// `--tuning` (after `KESTREL_TUNING`) reaches the backend and is reported in the `--json` stats;
/// a bad setting fails before any device is opened, naming the key, the source and what it takes.
#[test]
fn tuning_is_validated_and_reported() {
    fails(
        &["generate", "--prompt-ids", "2,105", "--tuning", "qmv_digit=off"],
        &["--tuning", "unknown tuning `qmv_digit`"],
    );
    fails(
        &["generate", "--prompt-ids", "2,105", "--tuning", "norm_threads=300"],
        &["norm_threads", "256, 512 or 1024"],
    );
    let o = Command::new(BIN)
        .args(["generate", "--prompt-ids", "2,105", "--backend", "cpu"])
        .env("KESTREL_TUNING", "attn_short")
        .output()
        .expect("run kestrel");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "a malformed KESTREL_TUNING was accepted:\n{err}");
    assert!(err.contains("KESTREL_TUNING") && err.contains("not key=value"), "{err}");
    let args =
        ["generate", "--prompt-ids", "2,105", "--max-new", "2", "--json", "--tuning", "qmv_digits=off,attn_short=7"];
    let Some(o) = succeeds(&args) else { return };
    let t = &json_of(&o)["stats"]["tuning"];
    assert_eq!((t["qmv_digits"].as_str(), t["attn_short"].as_str()), (Some("off"), Some("7")), "{t}");
    assert_eq!(t["fuse_wide"].as_str(), Some("gated"), "an unset key is not at its default: {t}");
}

#[test]
fn json_embedded_model() {
    for backend in ["cpu", "wgpu"] {
        let Some(o) =
            succeeds(&["generate", "--prompt-ids", "2,105", "--max-new", "5", "--json", "--backend", backend])
        else {
            continue;
        };
        let v = json_of(&o);
        check_json(&v, 5);
        assert_eq!(v["stats"]["prompt_tokens"], 2);
        assert_eq!(v["stats"]["backend"], backend);
        assert_eq!(o.stderr.lines().count(), 1, "stderr: {}", o.stderr);
        assert!(o.stderr.contains("prompt: 2 tokens") && o.stderr.contains("generated: 5 tokens"), "{}", o.stderr);
    }
}

#[test]
fn text_prompt() {
    let o = succeeds(&["generate", "--backend", "cpu", "--prompt", "hi", "--max-new", "8"]).unwrap();
    assert!(o.stdout.ends_with('\n'));
    assert!(o.stderr.contains("generated:"), "{}", o.stderr);
    let o = succeeds(&[
        "generate",
        "--backend",
        "cpu",
        "--prompt",
        "hi",
        "--system",
        "be brief",
        "--max-new",
        "8",
        "--json",
    ])
    .unwrap();
    let v = json_of(&o);
    assert!(v["stats"]["prompt_tokens"].as_u64().unwrap() > 3);
    let o = succeeds(&["generate", "--backend", "cpu", "--prompt", "hi", "--raw", "--max-new", "4", "--json"]).unwrap();
    let raw = json_of(&o)["stats"]["prompt_tokens"].as_u64().unwrap();
    assert!((2..=3).contains(&raw), "--raw: <bos> + the text's tokens, no template ({raw} tokens)");
    let dir = std::env::temp_dir().join(format!("kestrel-cli-{}-okmsgs", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("m.json");
    std::fs::write(&f, r#"[{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]"#).unwrap();
    let o =
        succeeds(&["generate", "--backend", "cpu", "--messages-file", f.to_str().unwrap(), "--max-new", "4", "--json"])
            .unwrap();
    check_json(&json_of(&o), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ignore_eos_gives_max_new() {
    for n in ["1", "37"] {
        let o = succeeds(&["generate", "--backend", "cpu", "--prompt", "hi", "--max-new", n, "--ignore-eos", "--json"])
            .unwrap();
        let v = json_of(&o);
        check_json(&v, n.parse().unwrap());
        assert_eq!(v["stats"]["finish_reason"], "length");
    }
    let o = succeeds(&["generate", "--backend", "cpu", "--prompt", "hi", "--max-new", "0", "--json"]).unwrap();
    check_json(&json_of(&o), 0);
}

/// The sampling flags take effect and the seed fixes the draw: the same seed twice gives the same
/// ids, another seed other ids, and either differs from greedy decoding of the same prompt. With
/// the flags ignored the sampled run would be the greedy one, and with the seed ignored the two
/// seeds would agree (12 tokens drawn at temperature 1.3 from the random embedded model's nearly
/// flat distribution: two draws agree on all 12 with negligible probability).
#[test]
fn sampling_is_seeded() {
    let base = ["generate", "--backend", "cpu", "--prompt-ids", "2,105", "--max-new", "12", "--ignore-eos", "--json"];
    let sampled = |seed: &str| {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--temp", "1.3", "--top-k", "40", "--top-p", "0.9", "--seed", seed]);
        ids_of(&json_of(&succeeds(&a).unwrap()))
    };
    let greedy = ids_of(&json_of(&succeeds(&base).unwrap()));
    let x = sampled("7");
    let y = sampled("7");
    let z = sampled("8");
    assert_eq!(x.len(), 12);
    assert_ne!(x, greedy, "sampling gave the greedy ids: the sampling flags are not used");
    assert_ne!(z, greedy, "sampling gave the greedy ids: the sampling flags are not used");
    assert_eq!(x, y, "same seed, same ids");
    assert_ne!(x, z, "seeds 7 and 8 drew the same ids: the seed is not used");
}

/// `kestrel generate ... | head -c 1`: the reader goes away; kestrel stops quietly with exit 0.
#[test]
fn broken_pipe_exits_zero() {
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec!["generate", "--backend", "cpu", "--prompt", "hi", "--max-new", "400", "--ignore-eos"];
        args.extend_from_slice(extra);
        let what = args.join(" ");
        let mut child = spawn(&args);
        let err = drain(child.stderr.take());
        let mut stdout = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        stdout.read_exact(&mut one).unwrap();
        drop(stdout);
        let status = wait_bounded(&mut child, &what, HANG);
        let err = err.join().unwrap();
        assert!(!err.contains("panicked"), "`{what}` panicked:\n{err}");
        assert!(status.success(), "`{what}` | head -c 1: {status:?}\n{err}");
        assert!(!err.contains("error"), "`{what}`: {err}");
    }
    // The pipe closed before the first byte.
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec!["generate", "--backend", "cpu", "--prompt", "hi", "--max-new", "8"];
        args.extend_from_slice(extra);
        let what = args.join(" ");
        let mut child = spawn(&args);
        drop(child.stdout.take());
        let err = drain(child.stderr.take());
        let status = wait_bounded(&mut child, &what, HANG);
        let err = err.join().unwrap();
        assert!(!err.contains("panicked"), "`{what}` panicked:\n{err}");
        assert!(status.success(), "`{what}` with stdout closed: {status:?}\n{err}");
    }
}

/// `generate --backend BACKEND` on tiny-e2b in both forms, the long prompt (40 tokens, past
/// twice the sliding window), 48 ids with EOS ignored, for each `--chunk` in `chunks`: the
/// reference's ids. None when a wgpu run found no adapter (tests/common's skip rule).
fn long_prompt_matches_reference(backend: &str, chunks: &[&str]) -> Option<()> {
    let long = prompt("long");
    let ids = id_list(&long);
    for (form, reference) in common::FORMS {
        let r = &common::load_refs("tiny-e2b", reference)[2];
        assert_eq!(r.prompt, long, "reference prompt 2 is the 'long' prompt");
        assert_eq!(r.generated.len(), 48);
        let dir = common::fixtures().join("tiny-e2b").join(form);
        for chunk in chunks {
            let args = [
                "generate",
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &ids,
                "--max-new",
                "48",
                "--ignore-eos",
                "--json",
                "--backend",
                backend,
                "--chunk",
                chunk,
            ];
            let v = json_of(&succeeds(&args)?);
            assert_eq!(
                ids_of(&v),
                r.generated,
                "tiny-e2b/{form} on {backend}, --chunk {chunk}: ids differ from {reference}"
            );
            assert_eq!(v["stats"]["prompt_tokens"], 40);
            assert_eq!(v["stats"]["backend"], backend, "{v}");
        }
    }
    Some(())
}

/// The binary reproduces transformers' greedy ids for the fixture's long prompt, in one prefill
/// chunk and in several.
#[test]
fn wgpu_matches_reference_ids() {
    long_prompt_matches_reference("wgpu", &["128", "16"]);
}

/// `--backend msl-emu` (the Metal kernels compiled for the CPU) does too.
#[test]
fn msl_emu_matches_reference_ids() {
    long_prompt_matches_reference("msl-emu", &["512"]).expect("msl-emu needs no adapter");
}

/// `kestrel bench` on a backend other than wgpu measures pp and tg; `--compare A,B` runs two
/// backends in one process: each one's figures, B's rates over A's, and whether their greedy ids
/// agree (they must: cpu and msl-emu both give transformers' ids on the embedded model).
#[test]
fn bench_runs_any_backend_and_compares_two() {
    let o = succeeds(&["bench", "--backend", "msl-emu", "-p", "8", "-n", "4", "-r", "1", "--json"]).unwrap();
    let v = json_of(&o);
    assert_eq!(v["backend"], "msl-emu", "{v}");
    assert!(v["pp"]["tok_s"].as_f64().unwrap() > 0.0 && v["tg"]["tok_s"].as_f64().unwrap() > 0.0, "{v}");
    let o = succeeds(&["bench", "--compare", "cpu,msl-emu", "-p", "8", "-n", "6", "-r", "1", "--json"]).unwrap();
    let v = json_of(&o);
    let names: Vec<&str> = v["backends"].as_array().unwrap().iter().map(|b| b["backend"].as_str().unwrap()).collect();
    assert_eq!(names, ["cpu", "msl-emu"], "{v}");
    assert_eq!(v["tokens_agree"], true, "{v}");
    let tg = |i: usize| v["backends"][i]["tg"]["tok_s"].as_f64().unwrap();
    assert!((v["tg_ratio"].as_f64().unwrap() - tg(1) / tg(0)).abs() < 1e-9, "{v}");
    usage_fails(&["bench", "--compare", "cpu,foo"], &["foo"]);
    fails(&["bench", "--compare", "cpu"], &["--compare", "two backends"]);
    fails(&["bench", "--backend", "cpu", "--skip", "x"], &["--skip", "wgpu"]);
}

/// Without an Apple GPU, `--backend metal` fails with one line that says what it needs and
/// names both ways out.
#[cfg(not(target_os = "macos"))]
#[test]
fn metal_backend_needs_an_apple_gpu() {
    fails(
        &["generate", "--backend", "metal", "--prompt", "hi"],
        &["--backend metal", "Apple GPU", "--backend wgpu", "--backend msl-emu"],
    );
}

// ---------------------------------------------------------------------------------------------
// Installations (`kestrel install` / `verify`) and what loading rejects

/// A fresh installation of tiny-moe (MLX 4-bit) in a temp directory, removed on drop.
struct Installed {
    root: PathBuf,
    dir: PathBuf,
}

impl Installed {
    fn new(tag: &str) -> Self {
        let root = std::env::temp_dir().join(format!("kestrel-inst-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let dir = root.join("moe");
        let src = common::fixtures().join("tiny-moe/mlx-4bit");
        succeeds(&["install", src.to_str().unwrap(), dir.to_str().unwrap()]).unwrap();
        Installed { root, dir }
    }
    fn s(&self) -> &str {
        self.dir.to_str().unwrap()
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
    /// Flips one bit of `rel` at `off` (from the end when negative).
    fn flip(&self, rel: &str, off: i64) {
        let p = self.path(rel);
        let mut b = std::fs::read(&p).unwrap();
        let i = if off < 0 { (b.len() as i64 + off) as usize } else { off as usize };
        b[i] ^= 0x10;
        std::fs::write(&p, b).unwrap();
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Streamed generation on an installation (cpu: fast, and the check is backend-independent).
fn gen_streamed(dir: &str) -> Vec<&str> {
    vec![
        "generate",
        "--model",
        dir,
        "--backend",
        "cpu",
        "--prompt-ids",
        "2,105,3",
        "--max-new",
        "2",
        "--expert-slots",
        "4",
    ]
}

#[test]
fn install_then_verify_and_generate() {
    let inst = Installed::new("ok");
    let o = succeeds(&["verify", inst.s(), "--json"]).unwrap();
    assert_eq!(json_of(&o)["ok"], true);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(inst.path("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format_version"], 1);
    assert_eq!(m["sizes"]["n_experts"], 16);
    let files: Vec<&str> = m["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    for want in [
        "common.safetensors",
        "config.json",
        "experts.json",
        "experts/layer-000.bin",
        "experts/layer-005.bin",
        "tokenizer.json",
    ] {
        assert!(files.contains(&want), "manifest lacks {want}: {files:?}");
    }
    // Expert blobs are page-aligned: each layer file is n_experts × a multiple of 4096.
    let len = std::fs::metadata(inst.path("experts/layer-000.bin")).unwrap().len();
    assert_eq!(len % (16 * 4096), 0);
    let o = succeeds(&[gen_streamed(inst.s()), vec!["--json"]].concat()).unwrap();
    let v = json_of(&o);
    assert!(v["stats"]["experts"]["misses"].as_u64().unwrap() > 0);
    assert!(v["stats"]["experts"]["bytes_read_per_token"].as_f64().unwrap() > 0.0);
}

/// `--backend msl-emu` on an installation, experts streamed through 4 slots (tiny-moe routes
/// 4 of 16): the long prompt's 48 reference ids, with experts read from disk.
#[test]
fn msl_emu_streams_experts_and_matches_reference_ids() {
    let inst = Installed::new("msl");
    let long = prompt("long");
    let r = &common::load_refs("tiny-moe", "dequant4bit_reference")[2];
    assert_eq!(r.prompt, long);
    let ids = id_list(&long);
    let args = [
        "generate",
        "--model",
        inst.s(),
        "--backend",
        "msl-emu",
        "--expert-slots",
        "4",
        "--prompt-ids",
        &ids,
        "--max-new",
        "48",
        "--ignore-eos",
        "--json",
    ];
    let v = json_of(&succeeds(&args).unwrap());
    assert_eq!(ids_of(&v), r.generated, "tiny-moe installed, msl-emu, 4 slots: ids differ from the reference");
    assert!(v["stats"]["experts"]["misses"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn install_refuses_existing_destination_and_installed_source() {
    let inst = Installed::new("exists");
    let src = common::fixtures().join("tiny-moe/mlx-4bit");
    fails(&["install", src.to_str().unwrap(), inst.s()], &["already exists"]);
    let other = inst.root.join("again");
    fails(&["install", inst.s(), other.to_str().unwrap()], &["already an installation"]);
    assert!(!other.exists());
}

#[test]
fn flipped_byte_in_expert_file_is_detected() {
    let inst = Installed::new("flip-expert");
    inst.flip("experts/layer-003.bin", 5000);
    fails(&["verify", inst.s()], &["layer-003.bin", "SHA-256", "reinstall"]);
    // Loading hashes expert files on first use: streamed and resident runs both refuse.
    fails(&gen_streamed(inst.s()), &["layer-003.bin", "SHA-256"]);
    let resident = [
        "generate",
        "--model",
        inst.s(),
        "--backend",
        "cpu",
        "--prompt-ids",
        "2,105,3",
        "--max-new",
        "2",
        "--expert-slots",
        "all",
    ];
    fails(&resident, &["layer-003.bin", "SHA-256"]);
}

#[test]
fn flipped_byte_in_common_file_is_detected_at_load() {
    let inst = Installed::new("flip-common");
    inst.flip("common.safetensors", -3);
    fails(&gen_streamed(inst.s()), &["common.safetensors", "SHA-256"]);
}

#[test]
fn truncated_layer_file_is_detected_even_when_trusting_the_manifest() {
    let inst = Installed::new("truncated");
    let p = inst.path("experts/layer-001.bin");
    let len = std::fs::metadata(&p).unwrap().len() as usize;
    truncate(&p, len - 4096);
    fails(&gen_streamed(inst.s()), &["layer-001.bin", "truncated"]);
    fails(&[gen_streamed(inst.s()), vec!["--trust-manifest"]].concat(), &["layer-001.bin", "truncated"]);
    fails(&["verify", inst.s()], &["layer-001.bin"]);
}

#[test]
fn symlink_inside_installation_is_rejected() {
    let inst = Installed::new("symlink");
    let p = inst.path("experts/layer-002.bin");
    let moved = inst.root.join("layer-002.bin");
    std::fs::rename(&p, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &p).unwrap();
    fails(&gen_streamed(inst.s()), &["layer-002.bin", "symbolic link"]);
    fails(&["verify", inst.s()], &["symbolic link"]);
}

#[test]
fn unknown_manifest_version_is_rejected() {
    let inst = Installed::new("version");
    let p = inst.path("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replacen("\"format_version\": 1", "\"format_version\": 7", 1)).unwrap();
    fails(&gen_streamed(inst.s()), &["manifest.json", "format version 7", "reinstall"]);
    fails(&["verify", inst.s()], &["format version 7"]);
}

#[test]
fn expert_slots_need_an_installation() {
    let dir = common::fixtures().join("tiny-moe/mlx-4bit");
    fails(
        &[gen_on(dir.to_str().unwrap()), vec!["--expert-slots", "4"]].concat(),
        &["--expert-slots", "kestrel install"],
    );
    usage_fails(&[gen_on(dir.to_str().unwrap()), vec!["--expert-slots", "0"]].concat(), &["--expert-slots"]);
}

/// An install stopped midway leaves only `DST.partial`; the rerun keeps the files that still
/// verify, redoes a damaged one, and ends with the same manifest as an uninterrupted install.
#[test]
fn interrupted_install_resumes_to_an_identical_manifest() {
    let fresh = Installed::new("resume-ref");
    let src = common::fixtures().join("tiny-moe/hf");
    let root = fresh.root.join("resume");
    std::fs::create_dir_all(&root).unwrap();
    // The reference: an uninterrupted install of the same source.
    let whole = root.join("whole");
    succeeds(&["install", src.to_str().unwrap(), whole.to_str().unwrap()]).unwrap();
    let dst = root.join("moe");
    let partial = root.join("moe.partial");
    let o = run(&["install", src.to_str().unwrap(), dst.to_str().unwrap(), "--fail-after", "4"]);
    no_panic(&o, "install --fail-after 4");
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("rerun to resume"), "{}", o.stderr);
    assert!(!dst.exists(), "an interrupted install must not leave DST behind");
    assert!(partial.join(".journal").exists());
    // Damage one of the files already written: the resume must notice and redo it.
    let journal = std::fs::read_to_string(partial.join(".journal")).unwrap();
    let done: Vec<&str> = journal.lines().skip(1).map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(done.len(), 4, "{journal}");
    let victim = partial.join(done[0]);
    let mut b = std::fs::read(&victim).unwrap();
    b[10] ^= 1;
    std::fs::write(&victim, b).unwrap();
    let o = succeeds(&["install", src.to_str().unwrap(), dst.to_str().unwrap(), "--json"]).unwrap();
    let v = json_of(&o);
    assert_eq!(v["kept_from_interrupted_run"], 3, "three undamaged files are kept");
    assert!(!partial.exists());
    assert_eq!(
        std::fs::read(dst.join("manifest.json")).unwrap(),
        std::fs::read(whole.join("manifest.json")).unwrap(),
        "resumed manifest differs from an uninterrupted install's"
    );
    succeeds(&["verify", dst.to_str().unwrap()]).unwrap();
}

/// `kestrel bench --json` on the tiny E2B-shaped 4-bit fixture: the contract's fields are there
/// and consistent (pp's median between its slowest and fastest repetition, the layer its prompt
/// tail starts at, the tg figures and the roofline it measured, per-kernel profiles where the
/// device has timestamps). What the
/// numbers are is the benchmark's business, never a test's.
#[test]
fn bench_json_reports_pp_tg_and_the_roofline() {
    let model = common::fixtures().join("tiny-e2b/mlx-4bit");
    let Some(o) = succeeds_within(
        &["bench", "--model", model.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "3", "--json"],
        BENCH_HANG,
    ) else {
        return;
    };
    let v = json_of(&o);
    let pp = &v["pp"];
    assert_eq!((pp["tokens"].as_u64(), pp["repetitions"].as_u64()), (Some(8), Some(3)), "{pp}");
    let f = |x: &serde_json::Value, k: &str| x[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {x}"));
    let (t, lo, hi) = (f(pp, "tok_s"), f(pp, "tok_s_min"), f(pp, "tok_s_max"));
    assert!(0.0 < lo && lo <= t && t <= hi, "pp's median {t} must lie in [{lo}, {hi}]");
    // tiny-e2b: layers 0–4 own their K/V (5 of its 10 share them), so a prompt runs for its last
    // token alone from layer 4's attention on (WgpuOptions::prompt_tail).
    assert_eq!(pp["tail_from_layer"].as_u64(), Some(4), "{pp}");
    let tg = &v["tg"];
    assert_eq!(tg["tokens"].as_u64(), Some(4), "{tg}");
    for k in ["tok_s", "ms_per_token", "bytes_per_token", "gb_s", "roofline_gb_s", "roofline_fraction"] {
        assert!(f(tg, k) > 0.0, "tg.{k} must be positive: {tg}");
    }
    // GB/s is the bytes per token over the measured time per token.
    let gbs = f(tg, "bytes_per_token") / (f(tg, "ms_per_token") / 1e3) / 1e9;
    assert!(
        (gbs / f(tg, "gb_s") - 1.0).abs() < 1e-6,
        "tg.gb_s {} is not bytes_per_token / ms_per_token ({gbs})",
        f(tg, "gb_s")
    );
    assert!((f(tg, "roofline_fraction") - f(tg, "gb_s") / f(tg, "roofline_gb_s")).abs() < 1e-9, "{tg}");
    if let Some(kernels) = v["prefill_kernels"].as_array().filter(|k| !k.is_empty()) {
        assert!(
            kernels.iter().all(|k| k["dispatches"].as_u64().is_some_and(|d| d > 0) && k["kernel"].is_string()),
            "{kernels:?}"
        );
    }
}

/// `bench --draft` with the copy drafter (drafts get accepted): one entry per k = 1..=--draft-k,
/// each with its parts' times, the round in decode steps, the cost model's speedups at acceptance
/// 0.5–0.9 (tokens per round over the round's cost, so rising with acceptance) and the measured
/// run (greedy and speculative tok/s of the same tokens: the bench fails if they differ).
#[test]
fn bench_draft_reports_rounds_per_k() {
    let (model, drafter) = (common::fixtures().join("tiny-moe/hf"), common::fixtures().join("tiny-moe-assistant/hf"));
    let args = ["bench", "--model", model.to_str().unwrap(), "--draft", drafter.to_str().unwrap()];
    let Some(o) = succeeds_within(
        &[&args[..], &["--draft-k", "2", "-p", "16", "-n", "24", "-r", "1", "--json"]].concat(),
        BENCH_HANG,
    ) else {
        return;
    };
    let v = json_of(&o);
    let rounds = v["draft"].as_array().unwrap_or_else(|| panic!("no draft array: {v}"));
    assert_eq!(rounds.iter().map(|r| r["k"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2], "{v}");
    let f = |x: &serde_json::Value, k: &str| x[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {x}"));
    for r in rounds {
        for key in ["draft_ms", "verify_ms", "round_ms", "ahead_round_ms", "decode_ms", "round_vs_decode"] {
            assert!(f(r, key) > 0.0, "{key} must be positive: {r}");
        }
        // The round cost the speedups use: a round of the measured run (rounds run ahead).
        assert!((f(r, "round_vs_decode") - f(r, "ahead_round_ms") / f(r, "decode_ms")).abs() < 1e-9, "{r}");
        let k = r["k"].as_u64().unwrap() as i32;
        let exp = r["expected_speedup"].as_array().unwrap();
        assert_eq!(exp.len(), 5, "{r}");
        for e in exp {
            let a = f(e, "acceptance");
            let tokens: f64 = (0..=k).map(|j| a.powi(j)).sum();
            assert!((f(e, "speedup") - tokens / f(r, "round_vs_decode")).abs() < 1e-9, "{e} in {r}");
        }
        let m = &r["measured"];
        assert!((f(m, "speedup") - f(m, "speculative_tok_s") / f(m, "greedy_tok_s")).abs() < 1e-9, "{m}");
        // The copy drafter gets drafts accepted on the bench prompt: fewer passes than tokens.
        assert!(f(&m["stats"], "tokens_per_pass") > 1.0, "{m}");
    }
    fails(&[&args[..], &["--draft-k", "8"]].concat(), &["--draft-k 8", "1..=7"]);
    fails(&[&args[..], &["-n", "0"]].concat(), &["--draft", "-n"]);
}
