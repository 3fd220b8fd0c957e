//! A local launcher for tensor-parallel runs: starts N processes of one program as one MLX
//! distributed group on this machine, watches them, and hands back what each printed and wrote.
//! Shared by `qwen_mlp`, `bench_mlp --tp` and `tests/tensor_parallel.rs` (each includes this file
//! with `#[path]`).
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
//! when the time limit passes every process still running is stopped.
#![allow(dead_code)] // each program that includes it uses part of it

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_trellis::distributed::{env, is_available, CollectiveBackend, Group};

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
            CollectiveBackend::Any
                if mlx_trellis::backend() == mlx_trellis::Backend::Cuda && is_available(CollectiveBackend::Nccl) =>
            {
                CollectiveBackend::Nccl
            }
            CollectiveBackend::Any => CollectiveBackend::Ring,
            b @ (CollectiveBackend::Ring | CollectiveBackend::Nccl) => b,
            CollectiveBackend::Mpi => {
                bail!("the local launcher starts ring and NCCL groups; start MPI ones with mpirun")
            }
        })
    }
}

/// The relErr gate of an `n`-rank MLP with bf16 activations against the whole MLP: each rank's
/// partial output is rounded to bf16 and the all-reduce adds them in bf16, 2n - 1 roundings of
/// half a bf16 unit (2^-8 of the value) against the whole MLP's one, so (n + 1) · 2^-8, and never
/// below the crate's bf16 gate.
pub fn bf16_tp_gate(n: usize) -> f64 {
    ((n as f64 + 1.0) * 2f64.powi(-8)).max(1e-2)
}

/// A directory removed, with all it holds, when this is dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What became of one process.
#[derive(Debug)]
pub struct RankResult {
    pub rank: usize,
    /// Its exit status (after a stop, the kill's).
    pub status: Option<ExitStatus>,
    /// Why the launcher stopped it, if it did.
    pub stopped: Option<String>,
    pub stdout: String,
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
    pub backend: CollectiveBackend,
    pub ranks: Vec<RankResult>,
    /// The ranks that failed by themselves (not stopped by the launcher), in the order the
    /// watchdog saw them end; ranks that end within one of its polls are listed by rank.
    pub failures: Vec<usize>,
    /// Whether the time limit stopped it.
    pub timed_out: bool,
    pub elapsed: Duration,
    /// The directory the ranks shared ([`OUT`]).
    pub out: PathBuf,
    /// Removes `out` with the report.
    _out: TempDir,
}

impl Report {
    /// An error naming the first rank that failed (with the end of its standard error), or the
    /// time limit, unless every rank succeeded.
    pub fn check(&self) -> Result<()> {
        if let Some(&r) = self.failures.first() {
            let rr = &self.ranks[r];
            let others = if self.failures.len() > 1 {
                format!(" (then ranks {:?} failed too)", &self.failures[1..])
            } else {
                String::new()
            };
            bail!(
                "rank {r} of {} failed ({}){others}; the launcher stopped the rest. Its last words:\n{}",
                self.ranks.len(),
                rr.status.map_or("no status".into(), |s| s.to_string()),
                rr.stderr_tail(12)
            );
        }
        if self.timed_out {
            let running: Vec<String> =
                self.ranks.iter().filter(|r| r.stopped.is_some()).map(|r| r.rank.to_string()).collect();
            bail!("the launch passed its time limit; ranks {} were still running and were stopped", running.join(", "));
        }
        if let Some(r) = self.ranks.iter().find(|r| !r.succeeded()) {
            bail!("rank {} did not succeed: {:?}\n{}", r.rank, r.status, r.stderr_tail(12));
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
        .context("picking free ports")?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

fn fresh_dir() -> Result<TempDir> {
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "mlx-trellis-tp-{}-{}-{nanos}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
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
            std::fs::write(&hostfile, serde_json::to_string(&hosts)?)
                .with_context(|| format!("writing {}", hostfile.display()))?;
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
                bail!(
                    "{} GPU(s) ({:?}, from Launch::gpus or CUDA_VISIBLE_DEVICES) for {n} NCCL ranks",
                    gpus.len(),
                    gpus
                );
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
        bail!("a launch has at least one process");
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
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(e).with_context(|| format!("starting rank {r}: {cmd:?}"));
            }
        };
        let prefix = launch.echo.then(|| format!("[rank {r}] "));
        let so = drain(child.stdout.take().expect("piped"), None);
        let se = drain(child.stderr.take().expect("piped"), prefix);
        children.push((child, so, se));
    }
    let n = children.len();
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
            return Err(e).context("waiting for a rank");
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
                    stopped[r] = Some(reason.clone());
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

/// In a rank: the group the launcher's environment describes (strict), or this process alone for
/// a one-process ring launch. `None` when this process was not started by the launcher.
pub fn rank_group() -> Option<Result<(Group, PathBuf)>> {
    let role = std::env::var(ROLE).ok()?;
    let out = PathBuf::from(std::env::var(OUT).unwrap_or_default());
    Some((|| {
        let group = match role.as_str() {
            "alone" => Group::alone(),
            "ring" => Group::init(CollectiveBackend::Ring, true)?,
            "nccl" => Group::init(CollectiveBackend::Nccl, true)?,
            other => bail!("{ROLE} = {other:?} is not ring, nccl or alone"),
        };
        Ok((group, out))
    })())
}
