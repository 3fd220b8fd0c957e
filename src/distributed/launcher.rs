//! A local launcher for tensor-parallel runs: starts N processes of one program as one MLX
//! distributed group on this machine, watches them, and hands back what each printed and wrote.
//! The examples (`qwen_mlp`, `bench_mlp --tp`) and the tensor-parallel tests start their ranks
//! with it; a process learns from [`rank_group`] whether it is one of them.
//!
//! Each process gets the environment MLX's back-end reads: for the ring a hostfile of
//! `127.0.0.1` ports (`MLX_RANK`, `MLX_HOSTFILE`); for NCCL `MLX_RANK`, `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP`/`NCCL_PORT` (rank 0 listens there) and one GPU through
//! `CUDA_VISIBLE_DEVICES`. Every process gets `NCCL_NVLS_ENABLE=0`. The launcher also sets
//! [`ROLE`] (`ring`, `nccl`, or `alone` for a one-process run that needs no group) and [`OUT`],
//! a directory shared by the ranks for their results (removed when the [`Report`] is dropped).
//!
//! A watchdog bounds the run: when one process fails, the others are stopped at once (they would
//! otherwise wait for it in the group's first collective, or forever in the ring's accept), and
//! when the time limit passes every process still running is stopped. A launch that failed or
//! was stopped is an [`Error::Launch`] from [`Report::check`].
//!
//! Nothing outlives the launcher. On Linux each rank is killed when the thread that started it
//! ends (`PR_SET_PDEATHSIG`), so a launcher killed by any signal, `SIGKILL` included, takes its
//! ranks with it: call [`run`] from a thread that lives as long as the launch (the main thread).
//! While [`run`] watches its ranks, `SIGTERM`, `SIGINT` and `SIGHUP` stop them, remove the shared
//! directory and return an [`Error::Launch`] naming the signal (outside [`run`] these signals keep
//! their default action). A directory left by a launcher that was killed outright is removed by
//! the next launch ([`remove_stale_dirs`]).
//!
//! ```no_run
//! use std::process::Command;
//! use std::time::Duration;
//! use mlx_trellis::distributed::launcher::{rank_group, run, Launch};
//! use mlx_trellis::distributed::CollectiveBackend;
//! # fn main() -> mlx_trellis::Result<()> {
//! if let Some(joined) = rank_group() {
//!     let (group, out) = joined?; // a rank: do its part, write its results under `out`
//!     # let _ = (group, out);
//!     mlx_trellis::exit_process(0); // every exit path of a rank ends so
//! }
//! // The parent: this program again as two ranks of a ring on this machine.
//! let exe = std::env::current_exe().map_err(|e| mlx_trellis::Error::io("the running program", e))?;
//! let launch = Launch::new(2, CollectiveBackend::Ring, Duration::from_secs(60));
//! let report = run(&launch, &|_rank| Command::new(&exe))?;
//! report.check()?;
//! # Ok(())
//! # }
//! ```

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::device::{backend, Backend};
use crate::error::{Error, Result};

use super::backend::{is_available, CollectiveBackend};
use super::env;
use super::group::Group;
use super::stop_signals;

/// How a process learns it is a rank of a launch: `ring`, `nccl` or `alone`.
pub const ROLE: &str = "MLX_TRELLIS_TP_ROLE";
/// The directory the ranks of a launch share (the hostfile, results).
pub const OUT: &str = "MLX_TRELLIS_TP_OUT";

/// One launch: how many processes, over which back-end, for how long at most.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Processes (ranks).
    pub world: usize,
    /// [`CollectiveBackend::Ring`] or [`CollectiveBackend::Nccl`] ([`CollectiveBackend::Any`]: NCCL on MLX's CUDA build where it
    /// has NCCL, else the ring).
    pub backend: CollectiveBackend,
    /// The most the whole launch may take.
    pub timeout: Duration,
    /// NCCL: the GPU each rank sees (`CUDA_VISIBLE_DEVICES`); empty: rank r sees the r-th GPU of
    /// this process's `CUDA_VISIBLE_DEVICES`, or GPU r where that is unset.
    pub gpus: Vec<String>,
    /// Print each process's standard error as it comes, prefixed by its rank.
    pub echo: bool,
}

impl Launch {
    /// `world` processes over `backend`, at most `timeout`, echoing their standard error.
    pub fn new(world: usize, backend: CollectiveBackend, timeout: Duration) -> Launch {
        Launch { world, backend, timeout, gpus: Vec::new(), echo: true }
    }

    /// The back-end the processes will use: [`CollectiveBackend::Any`] resolved as MLX would on this build.
    pub fn resolved_backend(&self) -> Result<CollectiveBackend> {
        Ok(match self.backend {
            CollectiveBackend::Any if backend() == Backend::Cuda && is_available(CollectiveBackend::Nccl) => {
                CollectiveBackend::Nccl
            }
            CollectiveBackend::Any => CollectiveBackend::Ring,
            b @ (CollectiveBackend::Ring | CollectiveBackend::Nccl) => b,
            CollectiveBackend::Mpi => {
                return Err(Error::invalid(
                    "the local launcher starts ring and NCCL groups; start MPI ones with mpirun",
                ))
            }
        })
    }
}

/// A directory removed, with all it holds, when this is dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

/// Removes the directories directly under the system's temporary directory whose name is
/// `prefix`, then `-` and the id of a process that no longer runs (and anything after a further
/// `-`): what a process that was killed before it could clean up left behind. Directories of
/// running processes are kept. Returns how many were removed.
pub fn remove_stale_dirs(prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let Ok(pid) = rest.split('-').next().unwrap_or_default().parse::<u32>() else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && pid != std::process::id() && !process_runs(pid) && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a process with id `pid` exists (one that exists but belongs to another user counts).
fn process_runs(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that `pid` could be signalled; nothing is sent.
        let status = unsafe { libc::kill(pid, 0) };
        status == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// The prefix of the directories the launcher shares with its ranks (`PREFIX-PID-...`).
const DIR_PREFIX: &str = "mlx-trellis-tp";

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What became of one process.
#[derive(Debug)]
pub struct RankResult {
    /// Its rank.
    pub rank: usize,
    /// Its exit status (after a stop, the kill's).
    pub status: Option<ExitStatus>,
    /// Why the launcher stopped it, if it did.
    pub stopped: Option<String>,
    /// Its standard output (bytes that are not UTF-8 replaced).
    pub stdout: String,
    /// Its standard error (bytes that are not UTF-8 replaced).
    pub stderr: String,
    /// From the start of the launch to its end.
    pub elapsed: Duration,
}

impl RankResult {
    /// Whether it exited by itself with status 0.
    pub fn succeeded(&self) -> bool {
        self.stopped.is_none() && self.status.is_some_and(|s| s.success())
    }

    /// The last lines of its standard error, for messages.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// What became of a launch.
#[derive(Debug)]
pub struct Report {
    /// The back-end the ranks formed their group on.
    pub backend: CollectiveBackend,
    /// Every rank's result, by rank.
    pub ranks: Vec<RankResult>,
    /// The ranks that failed by themselves (not stopped by the launcher), in the order the
    /// watchdog saw them end; ranks that end within one of its polls are listed by rank, and a
    /// rank found ended by itself while the launcher stopped the rest after them.
    pub failures: Vec<usize>,
    /// Whether the time limit stopped it.
    pub timed_out: bool,
    /// From the start of the launch to its end.
    pub elapsed: Duration,
    /// The directory the ranks shared ([`OUT`]).
    pub out: PathBuf,
    /// Removes `out` with the report.
    _out: TempDir,
}

impl Report {
    /// An [`Error::Launch`] naming the first rank that failed (with the end of its standard
    /// error), or the time limit, unless every rank succeeded.
    pub fn check(&self) -> Result<()> {
        if let Some(&r) = self.failures.first() {
            let rr = &self.ranks[r];
            let others = if self.failures.len() > 1 {
                format!(" (then ranks {:?} failed too)", &self.failures[1..])
            } else {
                String::new()
            };
            // Ranks that fail together often fail because one of them did, which need not be the
            // first seen: each one's last words.
            let theirs: String = self.failures[1..]
                .iter()
                .map(|&o| format!("\nrank {o}'s last words:\n{}", self.ranks[o].stderr_tail(4)))
                .collect();
            return Err(Error::launch(format!(
                "rank {r} of {} failed ({}){others}; the launcher stopped the rest. Its last words:\n{}{theirs}",
                self.ranks.len(),
                rr.status.map_or("no status".into(), |s| s.to_string()),
                rr.stderr_tail(12)
            )));
        }
        if self.timed_out {
            let running: Vec<String> =
                self.ranks.iter().filter(|r| r.stopped.is_some()).map(|r| r.rank.to_string()).collect();
            return Err(Error::launch(format!(
                "the launch passed its time limit; ranks {} were still running and were stopped",
                running.join(", ")
            )));
        }
        if let Some(r) = self.ranks.iter().find(|r| !r.succeeded()) {
            return Err(Error::launch(format!(
                "rank {} did not succeed: {:?}\n{}",
                r.rank,
                r.status,
                r.stderr_tail(12)
            )));
        }
        Ok(())
    }
}

/// `n` distinct free TCP ports on 127.0.0.1, all held at once while they are picked. They are
/// released before the processes start, so another program could take one in between; the
/// kernel hands out recently freed ephemeral ports last.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::launch(format!("picking free ports: {e}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| Error::launch(format!("picking free ports: {e}"))))
        .collect()
}

fn fresh_dir() -> Result<TempDir> {
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    remove_stale_dirs(DIR_PREFIX);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}-{}-{}-{nanos}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(TempDir(dir))
}

/// The environment of each rank (variables to set; every other variable of a back-end, and
/// [`ROLE`], is removed from the child's environment: see [`inherited`]).
fn environments(launch: &Launch, backend: CollectiveBackend, out: &Path) -> Result<Vec<Vec<(String, String)>>> {
    let n = launch.world;
    let mut envs: Vec<Vec<(String, String)>> = (0..n)
        .map(|_| {
            vec![(env::NCCL_NVLS_ENABLE.to_string(), "0".to_string()), (OUT.to_string(), out.display().to_string())]
        })
        .collect();
    match backend {
        // A ring needs two processes; one process alone needs no group.
        CollectiveBackend::Ring if n == 1 => envs[0].push((ROLE.into(), "alone".into())),
        CollectiveBackend::Ring => {
            let ports = free_ports(n)?;
            let hosts: Vec<serde_json::Value> =
                ports.iter().map(|p| serde_json::json!([format!("127.0.0.1:{p}")])).collect();
            let hostfile = out.join("hostfile.json");
            let text = serde_json::to_string(&hosts).map_err(|e| Error::invalid(format!("the hostfile: {e}")))?;
            std::fs::write(&hostfile, text).map_err(|e| Error::io(&hostfile, e))?;
            for (r, e) in envs.iter_mut().enumerate() {
                e.push((ROLE.into(), "ring".into()));
                e.push((env::MLX_RANK.into(), r.to_string()));
                e.push((env::MLX_HOSTFILE.into(), hostfile.display().to_string()));
            }
        }
        CollectiveBackend::Nccl => {
            let port = free_ports(1)?[0];
            // One GPU per rank: those named, else the first n this process sees, else 0..n.
            let gpus: Vec<String> = if !launch.gpus.is_empty() {
                launch.gpus.clone()
            } else if let Ok(visible) = std::env::var(env::CUDA_VISIBLE_DEVICES) {
                visible.split(',').map(|g| g.trim().to_string()).filter(|g| !g.is_empty()).take(n).collect()
            } else {
                (0..n).map(|r| r.to_string()).collect()
            };
            if gpus.len() != n {
                return Err(Error::invalid(format!(
                    "{} GPU(s) ({:?}, from Launch::gpus or CUDA_VISIBLE_DEVICES) for {n} NCCL ranks",
                    gpus.len(),
                    gpus
                )));
            }
            for (r, e) in envs.iter_mut().enumerate() {
                e.push((ROLE.into(), "nccl".into()));
                e.push((env::MLX_RANK.into(), r.to_string()));
                e.push((env::MLX_WORLD_SIZE.into(), n.to_string()));
                e.push((env::NCCL_HOST_IP.into(), "127.0.0.1".into()));
                e.push((env::NCCL_PORT.into(), port.to_string()));
                e.push((env::CUDA_VISIBLE_DEVICES.into(), gpus[r].clone()));
            }
        }
        _ => unreachable!("resolved_backend gives the ring or NCCL"),
    }
    Ok(envs)
}

/// The variables a rank must not inherit from this process: every back-end's and [`ROLE`].
fn inherited() -> impl Iterator<Item = &'static str> {
    [CollectiveBackend::Ring, CollectiveBackend::Nccl, CollectiveBackend::Mpi]
        .into_iter()
        .flat_map(env::variables)
        .copied()
        .chain([ROLE])
}

/// Reads a child's pipe to its end (bytes that are not UTF-8 replaced), echoing lines with
/// `prefix` to standard error if asked.
fn drain(pipe: impl Read + Send + 'static, prefix: Option<String>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let l = String::from_utf8_lossy(&line);
            if let Some(p) = &prefix {
                eprint!("{p}{l}");
            }
            text.push_str(&l);
            line.clear();
        }
        text
    })
}

/// Whether a rank's `status` after the launcher's kill is its own ending (an exit, or a signal
/// other than the launcher's SIGKILL): it had ended before the kill reached it.
fn ended_by_itself(status: ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal() != Some(libc::SIGKILL)
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

/// Kills and reaps every child (those already ended included).
fn stop_all(children: &mut [(Child, JoinHandle<String>, JoinHandle<String>)]) {
    for (c, _, _) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Starts `launch.world` processes, rank `r` from `command(r)` with its environment added, and
/// waits for them under the watchdog (see the module docs).
pub fn run(launch: &Launch, command: &dyn Fn(usize) -> Command) -> Result<Report> {
    if launch.world == 0 {
        return Err(Error::invalid("a launch has at least one process"));
    }
    let backend = launch.resolved_backend()?;
    let dir = fresh_dir()?;
    let out = dir.0.clone();
    let envs = environments(launch, backend, &out)?;
    let start = Instant::now();
    let mut children: Vec<(Child, JoinHandle<String>, JoinHandle<String>)> = Vec::new();
    for (r, vars) in envs.iter().enumerate() {
        let mut cmd = command(r);
        for v in inherited() {
            cmd.env_remove(v);
        }
        cmd.envs(vars.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(Error::io(cmd.get_program(), e).context(format!("starting rank {r}: {cmd:?}")));
            }
        };
        let prefix = launch.echo.then(|| format!("[rank {r}] "));
        let so = drain(child.stdout.take().expect("piped"), None);
        let se = drain(child.stderr.take().expect("piped"), prefix);
        children.push((child, so, se));
    }
    let n = children.len();
    let signals = stop_signals::Watch::start();
    let mut status: Vec<Option<ExitStatus>> = vec![None; n];
    let mut stopped: Vec<Option<String>> = vec![None; n];
    let mut ended: Vec<Option<Duration>> = vec![None; n];
    let mut failures = Vec::new();
    let mut timed_out = false;
    loop {
        let mut broken = None;
        for (r, (child, _, _)) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                match child.try_wait() {
                    Ok(Some(s)) => {
                        status[r] = Some(s);
                        ended[r] = Some(start.elapsed());
                        if !s.success() {
                            failures.push(r);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        broken = Some(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = broken {
            stop_all(&mut children);
            return Err(Error::launch(format!("waiting for a rank: {e}")));
        }
        if let Some(signal) = signals.received() {
            stop_all(&mut children);
            return Err(Error::launch(format!(
                "the launcher received {signal}: it stopped its {n} rank(s) and removed {}",
                out.display()
            )));
        }
        let reason = if let Some(f) = failures.first() {
            Some(format!("stopped after rank {f} failed"))
        } else if start.elapsed() > launch.timeout {
            timed_out = true;
            Some(format!("stopped at the launch's time limit ({} s)", launch.timeout.as_secs()))
        } else {
            None
        };
        if let Some(reason) = reason {
            for (r, (child, _, _)) in children.iter_mut().enumerate() {
                if status[r].is_none() {
                    let _ = child.kill();
                    status[r] = child.wait().ok();
                    ended[r] = Some(start.elapsed());
                    // A rank that ended by itself since the last poll (its peers often fail
                    // because it did) keeps its own ending: a failure of its own, not a stop.
                    match status[r] {
                        Some(s) if ended_by_itself(s) => {
                            if !s.success() {
                                failures.push(r);
                            }
                        }
                        _ => stopped[r] = Some(reason.clone()),
                    }
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut ranks = Vec::new();
    for (r, (_, so, se)) in children.into_iter().enumerate() {
        ranks.push(RankResult {
            rank: r,
            status: status[r],
            stopped: stopped[r].take(),
            stdout: so.join().unwrap_or_default(),
            stderr: se.join().unwrap_or_default(),
            elapsed: ended[r].unwrap_or_default(),
        });
    }
    Ok(Report { backend, ranks, failures, timed_out, elapsed: start.elapsed(), out, _out: dir })
}

/// Makes the child started by `cmd` die with the thread that starts it (Linux), and refuse to
/// start when that thread's process is already gone.
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions, allocating nothing on success.
        unsafe { cmd.pre_exec(move || ask_for_death_signal(parent)) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// In a forked child before exec: asks for `SIGKILL` when the parent thread ends, and fails if
/// the parent (`parent`, a process id) has already gone.
#[cfg(target_os = "linux")]
fn ask_for_death_signal(parent: u32) -> std::io::Result<()> {
    // SAFETY: `prctl(PR_SET_PDEATHSIG, signal)` only sets this process's attribute.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The parent may have died before the signal was asked for.
    // SAFETY: `getppid` has no preconditions.
    if unsafe { libc::getppid() } as u32 != parent {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// In a rank: the group the launcher's environment describes (strict), or this process alone for
/// a one-process ring launch. `None` when this process was not started by the launcher. A rank
/// ends through [`exit_process`](crate::exit_process) on every path, a failed set-up included
/// (on CUDA, returning from `main` can abort in MLX's static destructors instead of exiting with
/// the rank's status).
pub fn rank_group() -> Option<Result<(Group, PathBuf)>> {
    let role = std::env::var(ROLE).ok()?;
    let out = PathBuf::from(std::env::var(OUT).unwrap_or_default());
    Some((|| {
        let group = match role.as_str() {
            "alone" => Group::alone(),
            "ring" => Group::init(CollectiveBackend::Ring, true)?,
            "nccl" => Group::init(CollectiveBackend::Nccl, true)?,
            other => return Err(Error::invalid(format!("{ROLE} = {other:?} is not ring, nccl or alone"))),
        };
        Ok((group, out))
    })())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Waits until `child` has exited without reaping it (Linux: its state in /proc is `Z`),
    /// as a rank that ends between two of the watchdog's polls is when the launcher kills it.
    fn wait_until_exited_unreaped(child: &Child) {
        let stat = format!("/proc/{}/stat", child.id());
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            match std::fs::read_to_string(&stat) {
                Ok(s) if s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                // No /proc (macOS): give it time.
                Err(_) => return std::thread::sleep(Duration::from_millis(500)),
            }
        }
        panic!("{} did not exit within 10 s", child.id());
    }

    #[test]
    fn a_rank_that_ended_before_the_kill_keeps_its_own_ending() {
        let mut failed = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        wait_until_exited_unreaped(&failed);
        let _ = failed.kill();
        let s = failed.wait().unwrap();
        assert!(ended_by_itself(s) && s.code() == Some(3), "{s:?}");
        let mut running = Command::new("sleep").arg("30").spawn().unwrap();
        running.kill().unwrap();
        let s = running.wait().unwrap();
        assert!(!ended_by_itself(s), "{s:?}");
    }

    #[test]
    fn the_failed_rank_is_reported_and_the_others_are_stopped() {
        let launch = Launch { echo: false, ..Launch::new(3, CollectiveBackend::Ring, Duration::from_secs(60)) };
        let script = |r: usize| if r == 1 { "echo broken >&2; exit 4" } else { "exec sleep 30" };
        let report = run(&launch, &|r| {
            let mut c = Command::new("sh");
            c.args(["-c", script(r)]);
            c
        })
        .unwrap();
        assert_eq!(report.failures, vec![1]);
        assert_eq!(report.ranks[1].status.and_then(|s| s.code()), Some(4));
        assert!(report.ranks[1].stopped.is_none() && report.ranks[1].stderr.contains("broken"));
        for r in [0, 2] {
            assert_eq!(report.ranks[r].stopped.as_deref(), Some("stopped after rank 1 failed"), "rank {r}");
        }
        assert!(report.elapsed < Duration::from_secs(10), "{:?}", report.elapsed);
        let err = format!("{:#}", report.check().unwrap_err());
        assert!(err.contains("rank 1 of 3 failed") && err.contains("broken"), "{err}");
    }

    #[test]
    fn ranks_that_fail_together_are_each_named_with_their_last_words() {
        use std::os::unix::process::ExitStatusExt;
        let rank = |r: usize, status: i32, stopped: Option<&str>, stderr: &str| RankResult {
            rank: r,
            status: Some(ExitStatus::from_raw(status)),
            stopped: stopped.map(str::to_string),
            stdout: String::new(),
            stderr: stderr.to_string(),
            elapsed: Duration::from_millis(10),
        };
        let report = Report {
            backend: CollectiveBackend::Ring,
            ranks: vec![
                rank(0, libc::SIGKILL, Some("stopped after rank 1 failed"), ""),
                rank(1, 256, None, "[ring] connection to a peer was lost"),
                rank(2, 256, None, "shard 2 of 3: model directory has neither model.safetensors"),
            ],
            failures: vec![1, 2],
            timed_out: false,
            elapsed: Duration::from_millis(10),
            out: PathBuf::from("unused"),
            _out: TempDir(PathBuf::from("/nonexistent/mlx-trellis-launcher-test")),
        };
        let err = format!("{:#}", report.check().unwrap_err());
        assert!(err.contains("rank 1 of 3 failed") && err.contains("then ranks [2] failed too"), "{err}");
        assert!(err.contains("connection to a peer was lost"), "{err}");
        assert!(err.contains("rank 2's last words:\nshard 2 of 3: model directory has neither"), "{err}");
    }
}
