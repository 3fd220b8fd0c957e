//! A time limit on forming a group. MLX's ring accepts its left neighbour's connection with no
//! time limit (and two ranks given the same `MLX_RANK` can both listen on one port), and NCCL's
//! set-up does not always honour `MLX_NCCL_TIMEOUT`; neither can be interrupted from outside
//! MLX's call. So [`Group::init`](super::Group::init) runs MLX's set-up under a watchdog thread:
//! when the group has not formed within [`MLX_TRELLIS_SETUP_TIMEOUT`] seconds (default
//! [`DEFAULT_SETUP_TIMEOUT`]), it prints which rank waited for which rank at which address and
//! ends the process with exit status 2, at once: the thread blocked inside MLX could not be
//! unwound, and running the process's exit handlers under it could hang or abort.

use std::io::Write as _;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

use super::backend::CollectiveBackend;
use super::env::{Membership, MLX_HOSTFILE, NCCL_HOST_IP, NCCL_PORT};

/// Seconds a process may wait for its group to form (a positive number) before it is ended
/// with exit status 2.
pub const MLX_TRELLIS_SETUP_TIMEOUT: &str = "MLX_TRELLIS_SETUP_TIMEOUT";
/// The time limit on forming a group where [`MLX_TRELLIS_SETUP_TIMEOUT`] is unset.
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// The time limit from the environment.
pub(crate) fn setup_timeout(var: &dyn Fn(&str) -> Option<String>) -> Result<Duration> {
    let Some(v) = var(MLX_TRELLIS_SETUP_TIMEOUT).filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_SETUP_TIMEOUT);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 1e7 => Ok(Duration::from_secs_f64(s)),
        _ => Err(Error::invalid(format!("{MLX_TRELLIS_SETUP_TIMEOUT} = {v:?} is not a positive number of seconds"))),
    }
}

/// What this rank waits for while its group forms, naming the ranks and addresses.
pub(crate) fn waits_for(m: &Membership, var: &dyn Fn(&str) -> Option<String>) -> String {
    let (r, n) = (m.rank, m.size);
    match m.backend {
        CollectiveBackend::Ring => {
            let path = var(MLX_HOSTFILE).unwrap_or_default();
            let addresses = ring_addresses(Path::new(&path));
            let at = |rank: usize| addresses.get(rank).map_or_else(|| "?".to_string(), |a| a.join(", "));
            let (left, right) = ((r + n - 1) % n, (r + 1) % n);
            format!(
                "rank {r} of {n} (ring, {MLX_HOSTFILE} {path:?}) listens on {} for rank {left} and connects to rank {right} at {}",
                at(r),
                at(right)
            )
        }
        CollectiveBackend::Nccl => {
            let address = format!("{}:{}", var(NCCL_HOST_IP).unwrap_or_default(), var(NCCL_PORT).unwrap_or_default());
            if r == 0 {
                format!("rank 0 of {n} (NCCL) listens on {address} for ranks 1 to {}", n.saturating_sub(1))
            } else {
                format!("rank {r} of {n} (NCCL) connects to rank 0 at {address}")
            }
        }
        b => format!("rank {r} of {n} ({b}) waits for the other ranks"),
    }
}

/// Each rank's addresses in a hostfile the environment checks already accepted.
fn ring_addresses(path: &Path) -> Vec<Vec<String>> {
    let text = crate::json::read_capped(path, 1 << 20, "a ring hostfile").unwrap_or_default();
    let value: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
    value
        .as_array()
        .map(|ranks| {
            ranks
                .iter()
                .map(|e| {
                    e.as_array()
                        .map_or_else(Vec::new, |a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A watchdog over one group set-up: dropping it (the set-up returned) stops it.
pub(crate) struct SetupWatchdog {
    done: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SetupWatchdog {
    /// Starts watching: after `limit` without a drop, prints `waiting` and ends the process.
    pub(crate) fn start(limit: Duration, waiting: String) -> SetupWatchdog {
        let (done, wait) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(
                    err,
                    "error: the distributed group did not form within {:.0} s ({MLX_TRELLIS_SETUP_TIMEOUT}): {waiting}. Check that every rank is started, each with its own rank, and that nothing else uses these addresses.",
                    limit.as_secs_f64()
                );
                let _ = err.flush();
                exit_without_teardown(2);
            }
        });
        SetupWatchdog { done: Some(done), thread: Some(thread) }
    }
}

impl Drop for SetupWatchdog {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends the process with `code` at once, without running exit handlers or destructors (another
/// thread is blocked inside MLX's set-up, whose objects could hang or abort if torn down).
fn exit_without_teardown(code: i32) -> ! {
    // SAFETY: `_exit` takes any status and does not return; no handler or destructor runs.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_limit_comes_from_the_environment() {
        let var = |v: &'static str| move |k: &str| (k == MLX_TRELLIS_SETUP_TIMEOUT).then(|| v.to_string());
        assert_eq!(setup_timeout(&|_| None).unwrap(), DEFAULT_SETUP_TIMEOUT);
        assert_eq!(setup_timeout(&var("2.5")).unwrap(), Duration::from_millis(2500));
        for bad in ["0", "-1", "soon", "NaN"] {
            let e = setup_timeout(&var(bad)).unwrap_err().to_string();
            assert!(e.contains(MLX_TRELLIS_SETUP_TIMEOUT), "{bad}: {e}");
        }
    }

    #[test]
    fn what_a_rank_waits_for_names_ranks_and_addresses() {
        let nccl = |rank| Membership { backend: CollectiveBackend::Nccl, rank, size: 2 };
        let var = |k: &str| match k {
            NCCL_HOST_IP => Some("10.0.0.1".to_string()),
            NCCL_PORT => Some("6000".to_string()),
            _ => None,
        };
        assert_eq!(waits_for(&nccl(0), &var), "rank 0 of 2 (NCCL) listens on 10.0.0.1:6000 for ranks 1 to 1");
        assert_eq!(waits_for(&nccl(1), &var), "rank 1 of 2 (NCCL) connects to rank 0 at 10.0.0.1:6000");
    }
}
