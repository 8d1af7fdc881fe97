//! The `kestrel` command line: clap definitions (the flag and `--json` contract) and dispatch
//! to one file per subcommand. Everything is validated before a device is opened.

mod bench;
mod generate;
mod install;
mod synth;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::backend::BackendKind;
use crate::kernels::Tuning;
use crate::streamer::ExpertSlots;

#[derive(Parser, Debug)]
#[command(
    name = "kestrel",
    version,
    about = "Gemma 4 inference: portable GPU kernels, 4-bit weights, output you can trust"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt (streams text to stdout, stats to stderr).
    Generate(GenerateArgs),
    /// Measure prefill and decode throughput, bandwidth and per-kernel GPU time.
    Bench(BenchArgs),
    /// Write a synthetic checkpoint (random weights of realistic magnitude) of a real architecture:
    /// a target model or its MTP drafter.
    Synth(SynthArgs),
    /// Repack a checkpoint into Kestrel's installed layout (per-layer expert files, manifest).
    Install(InstallArgs),
    /// Re-check every file of an installation against its manifest.
    Verify(VerifyArgs),
}

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// Source checkpoint directory (HF or MLX: config.json, *.safetensors, tokenizer files).
    pub src: PathBuf,
    /// Destination directory (must not exist; written as DST.partial and renamed when verified).
    pub dst: PathBuf,
    /// Parallel writers [default: cores, at most 4].
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Test hook: stop (as if killed) after writing this many files.
    #[arg(long, hide = true)]
    pub fail_after: Option<usize>,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Installation directory.
    pub dir: PathBuf,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens to prefill (pp).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode (tg).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Tokens of context before the decode test (as llama-bench's -d): tg's first step attends
    /// to this many positions. The default, 1, is llama-bench's tg (an empty context).
    #[arg(short = 'd', long = "depth", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub depth: u64,
    /// Repetitions of the prefill test; the median is reported (as llama-bench's -r).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Also measure speculative decoding with this MTP drafter (made for this model), on the
    /// GPU beside the target: per k = 1..=--draft-k, the draft, verify and whole-round times in
    /// decode steps, the speedup they allow at acceptance 0.5–0.9, and greedy against
    /// speculative tok/s on the bench prompt.
    #[arg(long, value_name = "DIR")]
    pub draft: Option<PathBuf>,
    /// The largest k (drafts per round) --draft measures.
    #[arg(long, default_value_t = 3, value_name = "K")]
    pub draft_k: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print the recorded program (one line per dispatch: kernels, grids, bindings, params) and
    /// exit without measuring: two builds that print the same lines run the same GPU work.
    #[arg(long)]
    pub list_program: bool,
    /// Leave the kernels whose label starts with one of these out of every step (a kernel's
    /// marginal cost in the pipelined step: bench with and without it). The output is wrong.
    #[arg(long, value_name = "LABEL,…", value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Run two backends on the same model in one process (e.g. `metal,wgpu`): pp and tg of
    /// each, their ratio, and whether their greedy tokens agree.
    #[arg(long, value_name = "A,B", value_delimiter = ',', value_parser = parse_backend)]
    pub compare: Vec<BackendKind>,
}

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Architecture: e2b, e4b or 26b-a4b (target models), or e2b-assistant, e4b-assistant or
    /// 26b-a4b-assistant (their MTP drafters, shaped to fit the synthetic targets).
    #[arg(long)]
    pub arch: String,
    /// Weight format: 4bit, 8bit (MLX affine, group 64) or bf16.
    #[arg(long, default_value = "4bit")]
    pub quant: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; must not exist yet).
    pub dir: PathBuf,
}

/// Model and device selection shared by subcommands.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json). Default: the small model
    /// embedded in the binary.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// Backend: `wgpu` (GPU through Vulkan/Metal/DX12), `metal` (raw-MSL kernels on an Apple GPU),
    /// `msl-emu` (those MSL kernels compiled for the CPU; slow, for cross-checking) or `cpu` (the
    /// f32 reference, slow).
    #[arg(long, default_value = "wgpu", value_parser = parse_backend)]
    pub backend: BackendKind,

    /// Context length (prompt + generated tokens) the KV cache holds [default: 4096, or the
    /// model's max_position_embeddings if smaller].
    #[arg(long)]
    pub ctx: Option<usize>,

    /// Prefill chunk size in tokens. Larger chunks read each weight once per more tokens
    /// (H200, E2B pp512: 1153 tok/s with 128, 2270 with 512); the cost is activation memory.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,

    /// MoE installations: expert cache slots per layer, or `all` to keep every expert resident
    /// [default: 16]. Checkpoints that are not installed keep every expert resident.
    #[arg(long, value_name = "N|all")]
    pub expert_slots: Option<ExpertSlots>,

    /// Installations: check file sizes and the small files' hashes only, not the large files'.
    #[arg(long)]
    pub trust_manifest: bool,

    /// wgpu kernel and program choices, `key=value[,key=value…]` (on/off for switches), applied
    /// after those in the KESTREL_TUNING environment variable; `kestrel bench` prints every
    /// setting. For measurements and tests: the defaults are the measured best (README: Tuning).
    #[arg(long, value_name = "KEY=VALUE,…")]
    pub tuning: Vec<String>,
}

/// Default expert cache slots per layer of a streamed installation.
pub const DEFAULT_EXPERT_SLOTS: usize = 16;

impl ModelArgs {
    /// The context length to use for a model supporting `model_max` positions.
    pub fn ctx_for(&self, model_max: usize) -> usize {
        self.ctx.unwrap_or(4096.min(model_max))
    }

    /// The backend's [`Tuning`]: the defaults, then `KESTREL_TUNING`, then `--tuning` (read
    /// here, once, so that nothing below the command line depends on the environment).
    pub fn tuning(&self) -> anyhow::Result<Tuning> {
        let mut tuning = Tuning::default();
        if let Ok(list) = std::env::var("KESTREL_TUNING") {
            tuning.apply(&list).map_err(|e| anyhow::anyhow!("KESTREL_TUNING: {e}"))?;
        }
        for list in &self.tuning {
            tuning.apply(list).map_err(|e| anyhow::anyhow!("--tuning: {e}"))?;
        }
        Ok(tuning)
    }
}

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    s.parse()
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// One user turn, rendered with the model's chat template (unless --raw).
    #[arg(long, group = "input", value_name = "TEXT")]
    pub prompt: Option<String>,

    /// Prompt token ids, comma-separated (e.g. 2,105,2364); no template is applied.
    #[arg(long, group = "input", value_name = "IDS", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,

    /// A JSON file holding a list of {"role", "content"} messages, rendered with the chat template.
    #[arg(long, group = "input", value_name = "FILE")]
    pub messages_file: Option<PathBuf>,

    /// With --prompt: tokenize the text as is (with <bos>), without the chat template.
    #[arg(long)]
    pub raw: bool,

    /// A system message placed before the --prompt user turn.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,

    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_new: usize,

    /// Sampling temperature; 0 is greedy (deterministic).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub temp: f32,

    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,

    /// Keep the smallest set of tokens whose probability reaches p (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub top_p: f32,

    /// Penalise tokens already in the context (1: off; HF semantics).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub repetition_penalty: f32,

    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,

    /// Print one JSON object {"tokens", "text", "stats"} instead of streaming text.
    #[arg(long)]
    pub json: bool,

    /// Speculative decoding with this MTP drafter (a gemma4_assistant model directory): the
    /// output is exactly greedy decoding's, in fewer target passes. Greedy only.
    #[arg(long, value_name = "DIR")]
    pub draft: Option<PathBuf>,

    /// Drafts per round with --draft.
    #[arg(long, default_value_t = 2, value_name = "K")]
    pub draft_k: usize,
}

/// Parses the process arguments and runs the subcommand.
pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Install(args) => install::run(args),
        Command::Verify(args) => install::verify(args),
    }
}
