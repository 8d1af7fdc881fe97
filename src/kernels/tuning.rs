//! [`Tuning`]: every choice of kernel form and program shape that neither the model nor the device
//! forces, in one typed struct. A backend receives it once, when it is built, and passes it down
//! to whatever picks a kernel; nothing below backend construction reads the environment. The
//! command line fills it from the defaults, then `KESTREL_TUNING`, then `--tuning` (both
//! `key=value[,key=value…]`), and `kestrel bench` and the `--json` stats print it, so every
//! figure states the settings that produced it.
//!
//! Each default is the measured winner on the GPUs Kestrel is tuned on (NVIDIA H100 and H200);
//! each field's doc ends with the ledger rows (PERF_NOTES.md, cited as `ledger: DATE NAME`) that
//! measured it; the adopted row names the field (`tuning: key`). A setting stays a
//! field while a current measurement or a test needs its other value: tests run the non-default
//! forms through it (unfused norms, the float mat-vec loop, reductions without subgroups), and an
//! A/B run on new hardware repeats the measurement behind a default with it.

use std::fmt;

/// Which decode mat-vecs take a residual norm past [`Tuning::fuse_norms_up_to`]
/// (see [`super::shape::fuse_norm_into`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WideFuse {
    /// None: the width rule alone.
    None,
    /// The gated form (Gemma 4's per-layer gate).
    Gated,
    /// The gated form and the GeGLU.
    GatedGlu,
}

impl WideFuse {
    fn name(self) -> &'static str {
        match self {
            WideFuse::None => "none",
            WideFuse::Gated => "gated",
            WideFuse::GatedGlu => "gated-glu",
        }
    }
}

/// The kernel and program choices of a backend (see the module doc). `Tuning::default()` is what
/// `kestrel generate` and `kestrel bench` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// The widest residual stream whose norms every kind of decode mat-vec computes in its
    /// prologue (0: every norm its own dispatch; `usize::MAX`, written `all`: every width).
    /// Ledger: 2026-11-30 fuse-norms-2048.
    pub fuse_norms_up_to: usize,
    /// Which mat-vecs take the norms of wider residual streams. Ledger: 2026-12-03
    /// fuse-wide-gated (`gated-glu`: 2026-12-02 fuse-wide-gated-glu).
    pub fuse_wide: WideFuse,
    /// The 4-bit prefill mat-mats on tensor cores (f16 cooperative matrices), where the device
    /// has them. Ledger: 2026-11-30 qmm-coop.
    pub tensor_cores: bool,
    /// Prefill attention on tensor cores too (with `tensor_cores`). Ledger: 2026-12-01
    /// attention-coop.
    pub coop_attention: bool,
    /// Prefill's stacked gate|up mat-mat with the GeGLU as its epilogue on tensor cores (with
    /// `tensor_cores`), instead of the mat-mat and gelu_mul. Ledger: 2026-12-01 coop-glu.
    pub coop_glu: bool,
    /// The LM head of a prompt's last row as a mat-vec rather than a tensor-core tile of 128
    /// tokens of which one is used. Ledger: 2026-12-02 lm-head-matvec.
    pub lm_head_matvec: bool,
    /// Steps go to the queue in segments of 16, 32, 64, … dispatches as they are recorded, so
    /// the GPU starts while the host records the rest. Ledger: 2026-12-01 submit-segments.
    pub submit_segments: bool,
    /// Decode and verify attention norms and rotates q itself where no qkv_norm_rope writes it
    /// (KV-sharing layers, separate projections). Ledger: 2026-12-01 fold-q-norm.
    pub fold_q_norm: bool,
    /// A chunk's residual norm reads a split-k mat-mat's partials itself, and the qmm_sum that
    /// would write its input goes. Ledger: 2026-12-01 norm-splits.
    pub norm_splits: bool,
    /// A prompt's layers past its last K/V write run for its last token alone. Ledger: 2026-12-02
    /// prompt-tail, 2026-12-02 prompt-tail-last-kv.
    pub prompt_tail: bool,
    /// Decode and verify close a MoE block in one dispatch (moe_norm.wgsl) instead of three.
    /// Ledger: 2026-12-02 moe-norm.
    pub moe_norm: bool,
    /// Decode and verify run a MoE layer's dense branch beside the routed experts, with no
    /// barrier between them (every expert resident, 4-bit). Ledger: 2026-12-02 moe-overlap.
    pub moe_overlap: bool,
    /// Decode and verify rows of at most this many keys take attention_short (one dispatch)
    /// instead of attention_split + attention_combine (0: never). Ledger: 2026-12-03
    /// attention-short.
    pub attn_short: u32,
    /// The kernels that write a tensor-core mat-mat's x (norms, the GeGLU mat-mat, gelu_mul,
    /// tensor-core attention) also write its group sums, instead of a group_sum pass. Ledger:
    /// 2026-12-01 norm-sums, 2026-12-01 producer-sums-glu.
    pub producer_sums: bool,
    /// The per-layer gate's gelu_mul adds its split-k partials itself, instead of a qmm_sum pass.
    /// Ledger: 2026-12-01 gelu-splits.
    pub gelu_splits: bool,
    /// Tensor-core prefill attention writes its output's group sums for the o projection (with
    /// `producer_sums`). Ledger: 2026-12-01 attn-sums.
    pub attn_sums: bool,
    /// Chunk norms in the rows form (rmsnorm_rows.wgsl, 256 threads a row), not rmsnorm.wgsl's.
    /// Ledger: 2026-12-01 rows-norms.
    pub rows_norms: bool,
    /// The fused-norm and routed-expert mat-vecs multiply integer digits of their input (the
    /// digit loop) rather than its floats. Ledger: 2026-12-05 qmv-digits-fused-norm, 2026-12-05
    /// qmv-digits-experts.
    pub qmv_digits: bool,
    /// Reductions use subgroup operations where the device has them at one fixed size (off:
    /// workgroup-memory trees everywhere, the form of devices without them). Ledger: 2026-11-30
    /// subgroups.
    pub subgroups: bool,
    /// Threads of a decode or verify step's one-workgroup norm where the device allows them
    /// (256, 512 or 1024; else 256). Ledger: 2026-12-05 norm-threads-split (and 2026-12-05
    /// norm-threads-512, 2026-12-01 norm-threads-1024).
    pub norm_threads: u32,
    /// Threads of the MoE block's closing norm (256, 512 or 1024, as `norm_threads`). Ledger:
    /// 2026-12-05 norm-threads-split (and 2026-12-05 norm-threads-512).
    pub moe_norm_threads: u32,
    /// naga's runtime checks in the generated shaders (index clamps, loop counters). Off: every
    /// index a kernel computes is bounded by the shapes the host checks, and the checks cost
    /// 7–12 % on an H200; CI runs the kernel tests both ways. Ledger: 2026-11-30 shader-checks-off.
    pub shader_checks: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            fuse_norms_up_to: super::shape::PRO_MAX_HIDDEN,
            fuse_wide: WideFuse::Gated,
            tensor_cores: true,
            coop_attention: true,
            coop_glu: true,
            lm_head_matvec: true,
            submit_segments: true,
            fold_q_norm: true,
            norm_splits: true,
            prompt_tail: true,
            moe_norm: true,
            moe_overlap: true,
            attn_short: super::shape::ATTN_SHORT_MAX,
            producer_sums: true,
            gelu_splits: true,
            attn_sums: true,
            rows_norms: true,
            qmv_digits: true,
            subgroups: true,
            norm_threads: super::shape::RMSNORM_WG,
            moe_norm_threads: super::shape::MOE_NORM_WG,
            shader_checks: false,
        }
    }
}

/// Parses `on`/`off` (also `1`/`0`, `true`/`false`).
fn switch(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err(format!("tuning `{key}` takes on or off, not `{value}`")),
    }
}

/// Parses a count.
fn count<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("tuning `{key}` takes a whole number, not `{value}`"))
}

/// Parses a one-workgroup norm's thread count.
fn threads(key: &str, value: &str) -> Result<u32, String> {
    match count(key, value)? {
        t @ (256 | 512 | 1024) => Ok(t),
        t => Err(format!("tuning `{key}` takes 256, 512 or 1024 threads, not {t}")),
    }
}

fn on_off(b: bool) -> String {
    if b { "on" } else { "off" }.to_string()
}

impl Tuning {
    /// Every setting as `(key, value)`, in the order of the struct: what [`fmt::Display`] and
    /// the `--json` stats print, and what [`Tuning::set`] takes back.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "fuse_norms_up_to",
                if self.fuse_norms_up_to == usize::MAX { "all".into() } else { self.fuse_norms_up_to.to_string() },
            ),
            ("fuse_wide", self.fuse_wide.name().into()),
            ("tensor_cores", on_off(self.tensor_cores)),
            ("coop_attention", on_off(self.coop_attention)),
            ("coop_glu", on_off(self.coop_glu)),
            ("lm_head_matvec", on_off(self.lm_head_matvec)),
            ("submit_segments", on_off(self.submit_segments)),
            ("fold_q_norm", on_off(self.fold_q_norm)),
            ("norm_splits", on_off(self.norm_splits)),
            ("prompt_tail", on_off(self.prompt_tail)),
            ("moe_norm", on_off(self.moe_norm)),
            ("moe_overlap", on_off(self.moe_overlap)),
            ("attn_short", self.attn_short.to_string()),
            ("producer_sums", on_off(self.producer_sums)),
            ("gelu_splits", on_off(self.gelu_splits)),
            ("attn_sums", on_off(self.attn_sums)),
            ("rows_norms", on_off(self.rows_norms)),
            ("qmv_digits", on_off(self.qmv_digits)),
            ("subgroups", on_off(self.subgroups)),
            ("norm_threads", self.norm_threads.to_string()),
            ("moe_norm_threads", self.moe_norm_threads.to_string()),
            ("shader_checks", on_off(self.shader_checks)),
        ]
    }

    /// Sets one setting from its text form; the error names the key and what it takes.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "fuse_norms_up_to" => {
                self.fuse_norms_up_to = if value == "all" { usize::MAX } else { count(key, value)? };
            }
            "fuse_wide" => {
                self.fuse_wide = match value {
                    "none" => WideFuse::None,
                    "gated" => WideFuse::Gated,
                    "gated-glu" => WideFuse::GatedGlu,
                    _ => return Err(format!("tuning `fuse_wide` takes none, gated or gated-glu, not `{value}`")),
                }
            }
            "tensor_cores" => self.tensor_cores = switch(key, value)?,
            "coop_attention" => self.coop_attention = switch(key, value)?,
            "coop_glu" => self.coop_glu = switch(key, value)?,
            "lm_head_matvec" => self.lm_head_matvec = switch(key, value)?,
            "submit_segments" => self.submit_segments = switch(key, value)?,
            "fold_q_norm" => self.fold_q_norm = switch(key, value)?,
            "norm_splits" => self.norm_splits = switch(key, value)?,
            "prompt_tail" => self.prompt_tail = switch(key, value)?,
            "moe_norm" => self.moe_norm = switch(key, value)?,
            "moe_overlap" => self.moe_overlap = switch(key, value)?,
            "attn_short" => self.attn_short = count(key, value)?,
            "producer_sums" => self.producer_sums = switch(key, value)?,
            "gelu_splits" => self.gelu_splits = switch(key, value)?,
            "attn_sums" => self.attn_sums = switch(key, value)?,
            "rows_norms" => self.rows_norms = switch(key, value)?,
            "qmv_digits" => self.qmv_digits = switch(key, value)?,
            "subgroups" => self.subgroups = switch(key, value)?,
            "norm_threads" => self.norm_threads = threads(key, value)?,
            "moe_norm_threads" => self.moe_norm_threads = threads(key, value)?,
            "shader_checks" => self.shader_checks = switch(key, value)?,
            _ => {
                let keys: Vec<&str> = self.entries().into_iter().map(|(k, _)| k).collect();
                return Err(format!("unknown tuning `{key}`: the settings are {}", keys.join(", ")));
            }
        }
        Ok(())
    }

    /// Applies a list of `key=value` settings separated by commas (blank entries are ignored).
    pub fn apply(&mut self, list: &str) -> Result<(), String> {
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("tuning `{entry}` is not key=value (e.g. qmv_digits=off)"))?;
            self.set(key.trim(), value.trim())?;
        }
        Ok(())
    }

    /// The settings that differ from [`Tuning::default`], as `key=value` pairs.
    pub fn changes(&self) -> Vec<String> {
        let base = Tuning::default().entries();
        self.entries().into_iter().zip(base).filter(|(a, b)| a.1 != b.1).map(|((k, v), _)| format!("{k}={v}")).collect()
    }

    /// Every setting as a JSON object (the `tuning` field of `--json` output).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.entries().into_iter().map(|(k, v)| (k.to_string(), v.into())).collect())
    }
}

/// `key=value` for every setting, comma-separated: the form [`Tuning::apply`] reads.
impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.entries().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&text.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_reads_back_to_the_same_tuning() {
        let mut t =
            Tuning { fuse_norms_up_to: usize::MAX, fuse_wide: WideFuse::None, qmv_digits: false, ..Default::default() };
        t.norm_threads = 1024;
        let mut back = Tuning::default();
        back.apply(&t.to_string()).unwrap();
        assert_eq!(back, t);
        assert_eq!(t.changes(), ["fuse_norms_up_to=all", "fuse_wide=none", "qmv_digits=off", "norm_threads=1024"]);
        assert!(Tuning::default().changes().is_empty());
    }

    #[test]
    fn bad_settings_name_the_key_and_what_it_takes() {
        let mut t = Tuning::default();
        assert!(t.apply("qmv_digit=off").unwrap_err().contains("unknown tuning `qmv_digit`"));
        assert!(t.apply("qmv_digits=maybe").unwrap_err().contains("on or off"));
        assert!(t.apply("norm_threads=300").unwrap_err().contains("256, 512 or 1024"));
        assert!(t.apply("attn_short").unwrap_err().contains("not key=value"));
        assert_eq!(t, Tuning::default(), "a failed entry changes nothing before it fails");
    }
}
