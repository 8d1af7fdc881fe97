//! Compiling pre-passed MSL for the CPU: finds clang++, writes the embedded shim and runtime next
//! to the translation unit, and builds a shared library into a content-addressed cache. The cache
//! file appears only by rename, so concurrent processes never load a half-written library.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub const SHIM: &str = include_str!("../../../../msl/emu/metal_stdlib");
pub const RUNTIME_H: &str = include_str!("../../../../msl/emu/runtime.h");
pub const RUNTIME_CPP: &str = include_str!("../../../../msl/emu/runtime.cpp");

/// `-ffp-contract=off` and no fast math: results must not depend on the host's FMA or on
/// reassociation, so a CI failure replays anywhere. Warnings that signal a real porting bug are
/// errors; `const constant T` (legal MSL) repeats `const` after macro expansion.
pub const FLAGS: &[&str] = &[
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fno-fast-math",
    "-ffp-contract=off",
    "-fvisibility=hidden",
    // `half` is clang's storage-only __fp16, which x86 only lets be passed by value with this.
    "-Xclang",
    "-fallow-half-arguments-and-returns",
    "-Wall",
    "-Werror=unknown-attributes",
    "-Werror=return-type",
    "-Werror=uninitialized",
    "-Wno-duplicate-decl-specifier",
    "-Wno-unused-variable",
    "-Wno-unused-function",
    "-fno-exceptions",
];

const MISSING: &str = "--backend msl-emu compiles the Metal kernels for the CPU with clang++, which was not found: install clang (Debian/Ubuntu: apt install clang) or set KESTREL_MSL_CXX";

/// The C++ compiler: `$KESTREL_MSL_CXX` if set, else `clang++` (or a versioned `clang++-N`) on PATH.
pub fn compiler() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KESTREL_MSL_CXX") {
        let p = PathBuf::from(p);
        return if p.is_file() || find_on_path(&p).is_some() {
            Ok(find_on_path(&p).unwrap_or(p))
        } else {
            Err(Error::Invalid(format!("{MISSING} (KESTREL_MSL_CXX={} does not exist)", p.display())))
        };
    }
    for name in
        ["clang++", "clang++-20", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14"]
    {
        if let Some(p) = find_on_path(Path::new(name)) {
            return Ok(p);
        }
    }
    Err(Error::Invalid(MISSING.to_string()))
}

fn find_on_path(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file())
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KESTREL_CACHE_DIR") {
        return PathBuf::from(d).join("msl-emu");
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("kestrel").join("msl-emu");
    }
    if let Some(d) = std::env::var_os("HOME") {
        return PathBuf::from(d).join(".cache").join("kestrel").join("msl-emu");
    }
    std::env::temp_dir().join("kestrel-msl-emu")
}

fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), nanos)
}

/// Builds (or finds in the cache) the shared library for `tu`; returns its path.
pub fn build_library(cxx: &Path, tu: &str, defines: &[(&str, &str)], what: &str) -> Result<PathBuf> {
    let version = Command::new(cxx)
        .arg("--version")
        .output()
        .map_err(|e| Error::Invalid(format!("{MISSING} ({}: {e})", cxx.display())))?;
    let mut h = Sha256::new();
    for part in [tu, SHIM, RUNTIME_H, RUNTIME_CPP] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    for (k, v) in defines {
        h.update(format!("-D{k}={v}\0").as_bytes());
    }
    for f in FLAGS {
        h.update(f.as_bytes());
        h.update(b"\0");
    }
    h.update(&version.stdout);
    h.update(cxx.as_os_str().as_encoded_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();

    let dir = cache_dir();
    let lib = dir.join(format!("{}.so", &key[..32]));
    if lib.is_file() {
        return Ok(lib);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let tmp = dir.join(format!("tmp-{}-{}", &key[..12], unique_suffix()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = (|| {
        for (name, text) in
            [("metal_stdlib", SHIM), ("runtime.h", RUNTIME_H), ("runtime.cpp", RUNTIME_CPP), ("kernels.cpp", tu)]
        {
            let p = tmp.join(name);
            std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
        }
        let out = tmp.join("lib.so");
        let mut cmd = Command::new(cxx);
        cmd.args(FLAGS).arg("-I").arg(&tmp);
        for (k, v) in defines {
            cmd.arg(format!("-D{k}={v}"));
        }
        cmd.arg(tmp.join("kernels.cpp")).arg(tmp.join("runtime.cpp")).arg("-o").arg(&out).arg("-lm");
        let o = cmd.output().map_err(|e| Error::Invalid(format!("{MISSING} ({}: {e})", cxx.display())))?;
        if !o.status.success() {
            return Err(Error::Invalid(compile_error(what, &String::from_utf8_lossy(&o.stderr), &tmp)));
        }
        std::fs::rename(&out, &lib).map_err(|e| Error::io(&lib, e))?;
        Ok(lib.clone())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The compiler's first ~20 lines, with the temporary directory stripped so lines read
/// `decode.metal:12:5: error: ...` (the pre-pass's `#line`s make them `.metal` lines).
fn compile_error(what: &str, stderr: &str, tmp: &Path) -> String {
    let prefix = format!("{}/", tmp.display());
    let lines: Vec<String> = stderr.lines().take(20).map(|l| l.replace(&prefix, "")).collect();
    let first = lines.iter().find(|l| l.contains("error:")).cloned().unwrap_or_default();
    format!("MSL emulator: {what} failed to compile: {first}\n{}", lines.join("\n"))
}
