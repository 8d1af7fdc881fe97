//! `kestrel synth`: a full-size checkpoint of a real architecture (a target model or its MTP
//! drafter) with random weights, so every performance figure can be reproduced without
//! downloading real weights.

use std::process::ExitCode;

use anyhow::{bail, Context};

use super::SynthArgs;
use crate::synth::{preset, write_model, SynthOptions};

pub fn run(args: SynthArgs) -> anyhow::Result<ExitCode> {
    let bits = match args.quant.as_str() {
        "4bit" => Some(4),
        "8bit" => Some(8),
        "bf16" => None,
        other => bail!("unknown --quant `{other}`: choose 4bit, 8bit or bf16"),
    };
    if args.dir.exists() {
        bail!("{} already exists: synth writes a new directory", args.dir.display());
    }
    let cfg = preset(&args.arch)?;
    let t0 = std::time::Instant::now();
    write_model(&args.dir, &cfg, &SynthOptions { bits, group_size: 64, seed: args.seed })
        .with_context(|| format!("writing {}", args.dir.display()))?;
    let bytes = std::fs::metadata(args.dir.join("model.safetensors")).map(|m| m.len()).unwrap_or(0);
    eprintln!("wrote {} ({:.2} GB) in {:.1} s", args.dir.display(), bytes as f64 / 1e9, t0.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
