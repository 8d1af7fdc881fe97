//! `kestrel install SRC DST` and `kestrel verify DIR`.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use super::{InstallArgs, VerifyArgs};
use crate::install::{self, InstallOptions};

pub fn run(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let opts = InstallOptions {
        workers: args.workers,
        fail_after: args.fail_after,
        progress: std::io::stderr().is_terminal(),
    };
    let t0 = std::time::Instant::now();
    let r = install::install(&args.src, &args.dst, &opts)
        .with_context(|| format!("installing {} into {}", args.src.display(), args.dst.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let total: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    if args.json {
        println!(
            "{}",
            json!({
                "dir": args.dst,
                "files": r.manifest.files.len(),
                "bytes": total,
                "kept_from_interrupted_run": r.kept,
                "written": r.written,
                "heap_bound_bytes": r.heap_bound,
                "seconds": secs,
                "architecture": r.manifest.architecture,
                "sizes": r.manifest.sizes,
            })
        );
    } else {
        eprintln!(
            "installed {} ({}) into {}: {} files, {:.2} GiB ({} kept from an interrupted run), {:.1} s, heap bound {:.0} MiB",
            args.src.display(),
            r.manifest.architecture,
            args.dst.display(),
            r.manifest.files.len(),
            total as f64 / (1u64 << 30) as f64,
            r.kept,
            secs,
            r.heap_bound as f64 / 1048576.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let inst = install::verify(&args.dir, std::io::stderr().is_terminal())
        .with_context(|| format!("verifying {}", args.dir.display()))?;
    let total: u64 = inst.manifest.files.iter().map(|f| f.bytes).sum();
    if args.json {
        println!("{}", json!({ "dir": args.dir, "ok": true, "files": inst.manifest.files.len(), "bytes": total }));
    } else {
        eprintln!(
            "{}: OK ({} files, {:.2} GiB, every SHA-256 matches the manifest)",
            args.dir.display(),
            inst.manifest.files.len(),
            total as f64 / (1u64 << 30) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}
