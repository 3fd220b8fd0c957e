//! How much memory MLX can still get, and the check that an allocation sized from input fits
//! before MLX is asked for it.
//!
//! MLX 0.32's CPU allocator hands back a null buffer when `malloc` fails and the operation then
//! writes through it: the process dies of a segmentation fault instead of getting an error
//! (upstream, allocation failures throw since ml-explore/mlx#2874). The library therefore
//! checks what it is about to ask for: the arrays it makes from a shape ([`MlxArray::zeros`],
//! `ones`, `full`, `from_slice`) and the working set of a coded layer's product. The check is
//! an estimate made before a lazy graph runs; an operation MLX runs outside these checks can
//! still meet a failed `malloc`.
//!
//! [`MlxArray::zeros`]: crate::MlxArray::zeros

use mlx_sys as sys;

use crate::device::{backend, Backend};
use crate::error::{Error, Result};
use crate::ffi::call;

/// Bytes MLX may still allocate, where anything bounds it: MLX's memory limit less what it
/// holds and, on MLX's CPU back-end (whose buffers are the process's own memory), the machine's
/// available memory (`MemAvailable`), the cgroup's `memory.max` less `memory.current`, and the
/// address-space and data limits (`RLIMIT_AS`, `RLIMIT_DATA`) less what the process maps.
pub fn available_memory() -> Option<u64> {
    let mut bounds: Vec<u64> = Vec::new();
    if let Some(limit) = mlx_limit().filter(|&l| l > 0) {
        bounds.push(limit.saturating_sub(crate::device::active_memory().unwrap_or(0) as u64));
    }
    if backend() == Backend::Cpu {
        bounds.extend(host_bounds());
    }
    bounds.into_iter().min()
}

/// MLX's memory limit (`mlx_get_memory_limit`).
fn mlx_limit() -> Option<u64> {
    let mut limit = 0usize;
    // SAFETY: `limit` is a valid out-pointer.
    call(|| unsafe { sys::mlx_get_memory_limit(&mut limit) }).ok()?;
    Some(limit as u64)
}

/// What the host and the process's limits leave (Linux; nothing elsewhere).
fn host_bounds() -> Vec<u64> {
    let mut bounds = Vec::new();
    let field = |text: &str, name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        kb.checked_mul(1024)
    };
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") {
        bounds.extend(field(&meminfo, "MemAvailable:"));
    }
    let number = |path: &str| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    if let (Some(max), Some(current)) = (number("/sys/fs/cgroup/memory.max"), number("/sys/fs/cgroup/memory.current")) {
        bounds.push(max.saturating_sub(current));
    }
    #[cfg(unix)]
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for (resource, used) in [(libc::RLIMIT_AS, "VmSize:"), (libc::RLIMIT_DATA, "VmData:")] {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: `limit` is a valid out-pointer for the one resource asked about.
            if unsafe { libc::getrlimit(resource, &mut limit) } == 0 && limit.rlim_cur != libc::RLIM_INFINITY {
                bounds.push(limit.rlim_cur.saturating_sub(field(&status, used).unwrap_or(0)));
            }
        }
    }
    bounds
}

/// Below this many bytes an allocation is not checked: the check reads the limits anew each
/// time, which costs more than a small product (a decode step of one row) should pay.
const UNCHECKED_BYTES: u128 = 16 << 20;

/// Refuses an allocation of `bytes` (what `what` names) that MLX cannot get: an
/// [`Error::InvalidArgument`] naming the size and the memory left, before MLX is asked.
/// Allocations under 16 MiB pass unchecked.
pub(crate) fn check_fits(bytes: u128, what: impl FnOnce() -> String) -> Result<()> {
    if bytes < UNCHECKED_BYTES {
        return Ok(());
    }
    match available_memory() {
        Some(left) if bytes > u128::from(left) => Err(Error::invalid(format!(
            "{} needs {:.3} GB but MLX can get at most {:.3} GB now (MLX's memory limit, the machine's available memory and this process's limits); use fewer rows or free memory",
            what(),
            bytes as f64 / 1e9,
            left as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}
