//! Compiling generated sources with the host C++ compiler, with an on-disk
//! cache of executables keyed by the exact source text and compiler command.
//!
//! Cache layout (`MSL_SIM_CACHE`, default `<temp dir>/msl-sim-cache`):
//! * `runtime-<hash>.o` — the runtime (scheduler, fibers, I/O, `main`), built
//!   once per compiler and flags;
//! * `kernel-<hash>.cpp` / `kernel-<hash>` — a kernel unit and its executable.
//!
//! A cached executable is used only if the stored source equals the new one
//! byte for byte, so a hash collision cannot run the wrong kernel. Files are
//! produced under unique temporary names and renamed into place, which is
//! atomic: concurrent test threads or processes may build the same entry
//! twice but never see a partial file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::{io_err, SimError};

const PRELUDE: &str = include_str!("../cpp/prelude.hpp");
const RUNTIME: &str = include_str!("../cpp/runtime.cpp");

/// Flags for both translation units.
///
/// * `-O2`: a kernel unit compiles in about 0.2-0.3 s at any level from
///   `-O0` to `-O3` (parsing the prelude dominates), while `-O2` runs a
///   shuffle-heavy 256K-thread grid about 1.5-2x faster than `-O1`/`-O0`.
/// * `-fsingle-precision-constant`: unsuffixed floating literals are `float`,
///   as in MSL (which has no `double`).
/// * `-ffp-contract=off`: no implicit fused multiply-adds; only explicit
///   `fma()` fuses, so results do not depend on the host CPU.
/// * `-fno-strict-aliasing`, `-fwrapv`: kernels reinterpret pointers and
///   rely on wrapping integer arithmetic more freely than ISO C++ allows.
/// * `-fstack-clash-protection`: large frames touch every stack page as they
///   grow, so overflowing a fiber stack hits its guard page instead of
///   silently writing into the neighbouring fiber's stack.
/// * The warnings silenced are the ones MSL text triggers by design: clang
///   loop pragmas, Metal `[[attributes]]`, and the `h` literal suffix.
const FLAGS: &[&str] = &[
    "-std=c++17",
    "-O2",
    "-fsingle-precision-constant",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fwrapv",
    "-fstack-clash-protection",
    "-pthread",
    "-Wno-unknown-pragmas",
    "-Wno-attributes",
    "-Wno-literal-suffix",
];

/// The compiler command: `MSL_SIM_CXX` or `c++`.
fn compiler() -> String {
    std::env::var("MSL_SIM_CXX").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "c++".into())
}

/// Extra flags from `MSL_SIM_CXXFLAGS` (whitespace separated), appended last.
fn extra_flags() -> Vec<String> {
    std::env::var("MSL_SIM_CXXFLAGS").map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

/// The cache directory: `MSL_SIM_CACHE` or `<temp dir>/msl-sim-cache`.
pub(crate) fn cache_dir() -> PathBuf {
    match std::env::var_os("MSL_SIM_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => std::env::temp_dir().join("msl-sim-cache"),
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Continues a 64-bit FNV-1a hash `h` over `bytes`.
fn fnv1a64_update(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &byte| (h ^ u64::from(byte)).wrapping_mul(FNV_PRIME))
}

/// 64-bit FNV-1a of `parts`, each followed by a 0xff separator so that
/// ("ab", "c") and ("a", "bc") differ. Implemented here because std's hashers
/// are not stable across Rust versions and the cache outlives a build.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(FNV_OFFSET, |h, part| fnv1a64_update(fnv1a64_update(h, part), &[0xff]))
}

/// A unique path next to `target` for writing before the atomic rename.
fn temp_sibling(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    target.with_file_name(name)
}

fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), SimError> {
    let tmp = temp_sibling(path);
    std::fs::write(&tmp, contents).map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io_err(format!("renaming to {}", path.display())))
}

/// Compile command line shared by all compiles.
fn command_line() -> Vec<String> {
    let mut args: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
    args.extend(extra_flags());
    args
}

/// Runs the compiler with `args` plus `-o` a temporary file, then renames the
/// result to `target`; on failure returns the compiler's diagnostics.
fn compile_to(target: &Path, mut args: Vec<String>, what: &str, kept_source: &Path) -> Result<(), SimError> {
    let tmp = temp_sibling(target);
    args.extend(["-o".into(), tmp.display().to_string()]);
    let cxx = compiler();
    let out = Command::new(&cxx)
        .args(&args)
        .output()
        .map_err(io_err(format!("starting the C++ compiler `{cxx}` (set MSL_SIM_CXX to choose another)")))?;
    if !out.status.success() {
        return Err(SimError::Compile {
            kernel: what.to_string(),
            compiler: cxx,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            source_path: kept_source.to_path_buf(),
        });
    }
    std::fs::rename(&tmp, target).map_err(io_err(format!("renaming to {}", target.display())))
}

/// The runtime object file, built on first use.
fn runtime_object(dir: &Path) -> Result<PathBuf, SimError> {
    // One build at a time within this process (test threads would otherwise
    // all compile it at once on first use).
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());

    let source = RUNTIME.replacen("#include \"prelude.hpp\"", PRELUDE, 1);
    let args = command_line();
    let key = fnv1a64(&[compiler().as_bytes(), args.join(" ").as_bytes(), source.as_bytes()]);
    let obj = dir.join(format!("runtime-{key:016x}.o"));
    if obj.exists() {
        return Ok(obj);
    }
    let src = dir.join(format!("runtime-{key:016x}.cpp"));
    write_atomically(&src, source.as_bytes())?;
    let mut full = args;
    full.extend(["-c".into(), "-x".into(), "c++".into(), src.display().to_string()]);
    compile_to(&obj, full, "msl-sim runtime", &src)?;
    Ok(obj)
}

/// Result of [`build`].
pub(crate) struct Built {
    /// The executable.
    pub exe: PathBuf,
    /// Whether it came from the cache.
    pub cached: bool,
    /// Seconds spent compiling (0 when cached).
    pub compile_seconds: f64,
}

/// Returns an executable for the kernel unit `kernel_cpp`, compiling it
/// unless an identical one is cached.
pub(crate) fn build(kernel_name: &str, kernel_cpp: &str) -> Result<Built, SimError> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let source = format!("{PRELUDE}{kernel_cpp}");
    let args = command_line();
    let key = fnv1a64(&[compiler().as_bytes(), args.join(" ").as_bytes(), source.as_bytes(), RUNTIME.as_bytes()]);
    let exe = dir.join(format!("kernel-{key:016x}"));
    let src = dir.join(format!("kernel-{key:016x}.cpp"));
    if exe.exists() && std::fs::read(&src).map(|s| s == source.as_bytes()).unwrap_or(false) {
        return Ok(Built { exe, cached: true, compile_seconds: 0.0 });
    }

    let start = Instant::now();
    let runtime = runtime_object(&dir)?;
    // The source is published before the executable, so an executable that
    // exists always has its source next to it.
    write_atomically(&src, source.as_bytes())?;
    let mut full = args;
    full.extend(["-x".into(), "c++".into(), src.display().to_string()]);
    full.extend(["-x".into(), "none".into(), runtime.display().to_string()]);
    compile_to(&exe, full, kernel_name, &src)?;
    Ok(Built { exe, cached: false, compile_seconds: start.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::{fnv1a64, fnv1a64_update, FNV_OFFSET};

    #[test]
    fn fnv1a_matches_reference_values() {
        // FNV-1a 64 of "" and "a" (without the part separator).
        assert_eq!(fnv1a64_update(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64_update(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
    }
}
