//! The environment each back-end reads, checked before MLX sees it.
//!
//! MLX 0.32 reads its group's membership from environment variables (read in
//! `mlx/distributed/{ring,nccl,mpi}`): the ring `MLX_RANK` and `MLX_HOSTFILE` (a JSON list, one
//! entry per rank, each a list of `"host:port"` addresses); NCCL `MLX_RANK`, `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP` and `NCCL_PORT` (rank 0 listens there to hand out NCCL's unique id). Its
//! failures there are poor: a ring hostfile of no entries divides by zero, one of a single entry
//! makes the process connect to itself for half a minute, an unparsable rank reads as 0, a
//! partial environment silently gives a group of one process (each rank would then compute its
//! shard alone), and NCCL exits the process on its own errors. So the variables are checked here
//! first, and each problem is an [`Error::InvalidArgument`] that names the variables.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, ErrorContext, Result};
use crate::json;

use super::backend::CollectiveBackend;

/// The rank of this process in its group (ring and NCCL).
pub const MLX_RANK: &str = "MLX_RANK";
/// The ring's hostfile: a JSON list with one entry per rank, each a list of `"host:port"`
/// addresses (one connection to each neighbour per address).
pub const MLX_HOSTFILE: &str = "MLX_HOSTFILE";
/// The number of processes in the group (NCCL).
pub const MLX_WORLD_SIZE: &str = "MLX_WORLD_SIZE";
/// The address rank 0 listens on to hand out NCCL's unique id (NCCL).
pub const NCCL_HOST_IP: &str = "NCCL_HOST_IP";
/// The port of [`NCCL_HOST_IP`] (NCCL).
pub const NCCL_PORT: &str = "NCCL_PORT";
/// The GPUs a process sees. With NCCL each process of a group of several must see exactly one:
/// MLX runs its arrays on GPU 0 of the process, while its NCCL back-end binds rank `r` to GPU
/// `r % visible GPUs`.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// Set by Open MPI's `mpirun` for each process it starts (MLX's MPI back-end accepts Open MPI
/// only).
pub const OMPI_COMM_WORLD_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
/// Set by Open MPI's `mpirun`: the process's rank.
pub const OMPI_COMM_WORLD_RANK: &str = "OMPI_COMM_WORLD_RANK";
/// NCCL's own switch for NVLink multicast (NVLS); launchers here always set it to `0`.
pub const NCCL_NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";

/// A hostfile is a few addresses per rank; the cap bounds what a wrong path costs to read.
const MAX_HOSTFILE_BYTES: u64 = 1 << 20;

/// The variables `backend` reads to form a group (none for [`CollectiveBackend::Any`], which takes
/// another's).
pub fn variables(backend: CollectiveBackend) -> &'static [&'static str] {
    match backend {
        CollectiveBackend::Any => &[],
        CollectiveBackend::Ring => &[MLX_RANK, MLX_HOSTFILE],
        CollectiveBackend::Nccl => &[MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT],
        CollectiveBackend::Mpi => &[OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE],
    }
}

/// What the process's environment and the MLX build say, as the checks see them.
pub(crate) struct Env<'a> {
    /// A variable's value; empty values count as unset.
    pub(crate) var: &'a dyn Fn(&str) -> Option<String>,
    /// Whether the MLX build has a back-end.
    pub(crate) available: &'a dyn Fn(CollectiveBackend) -> bool,
    /// Whether MLX runs on CUDA (MLX's `any` tries NCCL only there).
    pub(crate) cuda: bool,
}

impl Env<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.is_empty())
    }
}

/// This process's place in a group, from a checked environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Membership {
    pub(crate) backend: CollectiveBackend,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

/// What to make of the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Join the group the environment describes.
    Join(Membership),
    /// No back-end's environment is set and the caller is not strict: this process alone.
    Alone,
}

/// How much of `backend`'s environment is set: the variables missing, and those set.
fn presence(backend: CollectiveBackend, env: &Env) -> (Vec<&'static str>, Vec<&'static str>) {
    variables(backend).iter().partition(|v| env.get(v).is_none())
}

/// `name = "value"` for each set variable, for messages.
fn shown(names: &[&str], env: &Env) -> String {
    names.iter().map(|n| format!("{n} = {:?}", env.get(n).unwrap_or_default())).collect::<Vec<_>>().join(", ")
}

fn incomplete(backend: CollectiveBackend, missing: &[&str], set: &[&str], env: &Env) -> String {
    let mut m = format!(
        "the {backend} back-end needs {} in the environment; missing: {}",
        variables(backend).join(", "),
        missing.join(", ")
    );
    if !set.is_empty() {
        m.push_str(&format!(" (set: {})", shown(set, env)));
    }
    m
}

fn unavailable(backend: CollectiveBackend) -> Error {
    let why = match backend {
        CollectiveBackend::Ring => "the ring is in MLX's CPU and macOS builds",
        CollectiveBackend::Nccl => "NCCL is in MLX's CUDA build (mlx-cuda), with NVIDIA's NCCL library loadable",
        CollectiveBackend::Mpi => "MLX loads Open MPI's libmpi.so (or the library MLX_MPI_LIBNAME names) at run time",
        CollectiveBackend::Any => "none of ring, NCCL or MPI is in it",
    };
    Error::invalid(format!("the loaded MLX library has no {backend} back-end ({why})"))
}

/// Decides, from the environment, how `Group::init(backend, strict)` forms its group.
pub(crate) fn plan(backend: CollectiveBackend, strict: bool, env: &Env) -> Result<Plan> {
    if backend == CollectiveBackend::Any {
        return plan_any(strict, env);
    }
    let (missing, set) = presence(backend, env);
    if set.is_empty() && !strict {
        return Ok(Plan::Alone);
    }
    if !(env.available)(backend) {
        return Err(unavailable(backend));
    }
    if !missing.is_empty() {
        return Err(Error::invalid(incomplete(backend, &missing, &set, env)));
    }
    Ok(Plan::Join(membership(backend, env)?))
}

/// [`CollectiveBackend::Any`]: the first available back-end, in MLX's order, whose variables are all set.
fn plan_any(strict: bool, env: &Env) -> Result<Plan> {
    let candidates: Vec<CollectiveBackend> = [CollectiveBackend::Nccl, CollectiveBackend::Ring, CollectiveBackend::Mpi]
        .into_iter()
        .filter(|&b| (b != CollectiveBackend::Nccl || env.cuda) && (env.available)(b))
        .collect();
    let mut partial = Vec::new();
    for &b in &candidates {
        let (missing, set) = presence(b, env);
        if missing.is_empty() {
            return Ok(Plan::Join(membership(b, env)?));
        }
        if !set.is_empty() {
            partial.push(incomplete(b, &missing, &set, env));
        }
    }
    if !partial.is_empty() {
        // A partial environment is a launch mistake: MLX would quietly give one process alone.
        return Err(Error::invalid(format!("no back-end's environment is complete: {}", partial.join("; "))));
    }
    if !strict {
        return Ok(Plan::Alone);
    }
    if candidates.is_empty() {
        return Err(Error::invalid("the loaded MLX library has no communication back-end (ring, NCCL or MPI)"));
    }
    let needs: Vec<String> = candidates.iter().map(|&b| format!("{b}: {}", variables(b).join(", "))).collect();
    Err(Error::invalid(format!(
        "no distributed environment is set; each back-end needs its variables ({})",
        needs.join("; ")
    )))
}

/// A non-negative integer variable.
fn int(name: &str, env: &Env) -> Result<usize> {
    let v = env.get(name).unwrap_or_default();
    v.trim().parse::<usize>().map_err(|_| Error::invalid(format!("{name} = {v:?} is not a non-negative integer")))
}

fn rank_below(rank: usize, size: usize, rank_var: &str, size_what: &str) -> Result<()> {
    if rank >= size {
        return Err(Error::invalid(format!("{rank_var} = {rank} is not below the group's size {size} ({size_what})")));
    }
    Ok(())
}

/// Checks `backend`'s variables (all set) and reads this process's rank and the group's size.
fn membership(backend: CollectiveBackend, env: &Env) -> Result<Membership> {
    let (rank, size) = match backend {
        CollectiveBackend::Any => unreachable!("plan_any picks a back-end first"),
        CollectiveBackend::Ring => {
            let rank = int(MLX_RANK, env)?;
            let path = env.get(MLX_HOSTFILE).unwrap_or_default();
            let size = ring_hostfile(Path::new(&path)).with_context(|| format!("{MLX_HOSTFILE} = {path:?}"))?;
            rank_below(rank, size, MLX_RANK, &format!("the entries of {MLX_HOSTFILE} {path:?}"))?;
            (rank, size)
        }
        CollectiveBackend::Nccl => {
            let rank = int(MLX_RANK, env)?;
            let size = int(MLX_WORLD_SIZE, env)?;
            if size == 0 {
                return Err(Error::invalid(format!("{MLX_WORLD_SIZE} = 0: a group has at least one process")));
            }
            rank_below(rank, size, MLX_RANK, MLX_WORLD_SIZE)?;
            match int(NCCL_PORT, env)? {
                1..=65535 => {}
                p => return Err(Error::invalid(format!("{NCCL_PORT} = {p} is not a TCP port (1 to 65535)"))),
            }
            if size > 1 {
                let devices = env.get(CUDA_VISIBLE_DEVICES);
                let count = devices.as_deref().map_or(0, |d| d.split(',').filter(|s| !s.trim().is_empty()).count());
                if count != 1 {
                    return Err(Error::invalid(format!(
                        "NCCL group of {size} processes: {CUDA_VISIBLE_DEVICES} must name exactly one GPU for each process (it is {devices:?}); MLX runs arrays on the process's GPU 0 while its NCCL back-end binds rank r to GPU r % visible GPUs"
                    )));
                }
            }
            (rank, size)
        }
        CollectiveBackend::Mpi => {
            let rank = int(OMPI_COMM_WORLD_RANK, env)?;
            let size = int(OMPI_COMM_WORLD_SIZE, env)?;
            if size < 2 {
                return Err(Error::invalid(format!(
                    "{OMPI_COMM_WORLD_SIZE} = {size}: MLX's MPI back-end needs a world of at least two processes"
                )));
            }
            rank_below(rank, size, OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)?;
            (rank, size)
        }
    };
    Ok(Membership { backend, rank, size })
}

/// Checks a ring hostfile (a JSON list of at least two entries, each a non-empty list of
/// `"host:port"` strings, every entry with as many as the others) and returns its rank count.
fn ring_hostfile(path: &Path) -> Result<usize> {
    let text = json::read_capped(path, MAX_HOSTFILE_BYTES, "a ring hostfile")?;
    let bad = |m: String| Error::invalid(format!("ring hostfile {}: {m}", path.display()));
    let value: Value = json::parse(&text).map_err(|p| bad(p.message))?;
    let Some(ranks) = value.as_array() else {
        return Err(bad("is not a JSON list (one entry per rank, each a list of \"host:port\" addresses)".into()));
    };
    if ranks.len() < 2 {
        return Err(bad(format!(
            "lists {} rank(s); a ring needs at least two (MLX's ring of one would connect to itself and fail; a process alone needs no group)",
            ranks.len()
        )));
    }
    let mut per_rank = None;
    for (r, entry) in ranks.iter().enumerate() {
        let Some(addresses) = entry.as_array().filter(|a| !a.is_empty()) else {
            return Err(bad(format!("entry {r} is not a non-empty list of \"host:port\" addresses")));
        };
        for a in addresses {
            let Some((host, port)) = a.as_str().and_then(|s| s.rsplit_once(':')) else {
                return Err(bad(format!("entry {r}: {a} is not a \"host:port\" string")));
            };
            if host.is_empty() || !matches!(port.parse::<u16>(), Ok(1..)) {
                return Err(bad(format!("entry {r}: {a} needs a host and a port from 1 to 65535")));
            }
        }
        match per_rank {
            None => per_rank = Some(addresses.len()),
            Some(n) if n != addresses.len() => {
                return Err(bad(format!(
                    "entry {r} has {} addresses and entry 0 has {n}; MLX's ring needs as many connections to each side",
                    addresses.len()
                )))
            }
            Some(_) => {}
        }
    }
    Ok(ranks.len())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn check(backend: CollectiveBackend, strict: bool, vars: &[(&str, &str)], cuda: bool) -> Result<Plan> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let var = move |k: &str| map.get(k).cloned();
        let available = |b: CollectiveBackend| b != CollectiveBackend::Mpi && (b != CollectiveBackend::Nccl || cuda);
        plan(backend, strict, &Env { var: &var, available: &available, cuda })
    }

    fn err(backend: CollectiveBackend, strict: bool, vars: &[(&str, &str)], cuda: bool) -> String {
        let e = check(backend, strict, vars, cuda).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
        e.to_string()
    }

    fn hostfile(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!("mlx-trellis-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }

    #[test]
    fn an_absent_environment_is_a_process_alone_unless_strict() {
        for b in CollectiveBackend::ALL {
            assert_eq!(check(b, false, &[], false).unwrap(), Plan::Alone, "{b}");
        }
        let e = err(CollectiveBackend::Ring, true, &[], false);
        assert!(e.contains("needs MLX_RANK, MLX_HOSTFILE") && e.contains("missing: MLX_RANK, MLX_HOSTFILE"), "{e}");
        let e = err(CollectiveBackend::Any, true, &[], false);
        assert!(e.contains("ring: MLX_RANK, MLX_HOSTFILE") && !e.contains("nccl"), "{e}");
        let e = err(CollectiveBackend::Any, true, &[], true);
        assert!(e.contains("nccl: MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT"), "{e}");
        // A back-end the build lacks, asked for strictly.
        assert!(err(CollectiveBackend::Nccl, true, &[], false).contains("no nccl back-end"));
        assert!(err(CollectiveBackend::Mpi, true, &[], false).contains("no mpi back-end"));
    }

    #[test]
    fn a_partial_environment_names_what_is_missing_even_when_not_strict() {
        let e = err(CollectiveBackend::Ring, false, &[(MLX_RANK, "1")], false);
        assert!(e.contains("missing: MLX_HOSTFILE") && e.contains("MLX_RANK = \"1\""), "{e}");
        let e = err(CollectiveBackend::Nccl, false, &[(MLX_RANK, "0"), (NCCL_PORT, "1234")], true);
        assert!(e.contains("missing: MLX_WORLD_SIZE, NCCL_HOST_IP"), "{e}");
        // `any` lists every back-end it could have taken.
        let e = err(CollectiveBackend::Any, false, &[(MLX_RANK, "0")], true);
        assert!(
            e.contains("nccl back-end") && e.contains("ring back-end") && e.contains("missing: MLX_HOSTFILE"),
            "{e}"
        );
        // Empty values count as unset.
        assert_eq!(
            check(CollectiveBackend::Ring, false, &[(MLX_RANK, ""), (MLX_HOSTFILE, "")], false).unwrap(),
            Plan::Alone
        );
    }

    #[test]
    fn ring_hostfiles_are_checked() {
        let good = hostfile("good.json", r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"], ["localhost:5002"]]"#);
        let p = check(CollectiveBackend::Ring, true, &[(MLX_RANK, "2"), (MLX_HOSTFILE, &good)], false).unwrap();
        assert_eq!(p, Plan::Join(Membership { backend: CollectiveBackend::Ring, rank: 2, size: 3 }));
        // `any` on the CPU build takes the ring.
        assert_eq!(check(CollectiveBackend::Any, true, &[(MLX_RANK, "2"), (MLX_HOSTFILE, &good)], false).unwrap(), p);
        let cases = [
            ("one.json", r#"[["127.0.0.1:5000"]]"#, "needs at least two"),
            ("empty.json", "[]", "lists 0 rank(s)"),
            ("object.json", r#"{"a": 1}"#, "not a JSON list"),
            ("entry.json", r#"[["127.0.0.1:5000"], []]"#, "entry 1 is not a non-empty list"),
            ("port.json", r#"[["127.0.0.1:5000"], ["127.0.0.1:0"]]"#, "port from 1 to 65535"),
            ("colon.json", r#"[["127.0.0.1:5000"], ["127.0.0.1"]]"#, "not a \"host:port\""),
            ("uneven.json", r#"[["a:1", "a:2"], ["b:1"]]"#, "entry 1 has 1 addresses"),
            ("json.json", "[[", "not valid JSON"),
        ];
        for (name, text, want) in cases {
            let path = hostfile(name, text);
            let e = err(CollectiveBackend::Ring, true, &[(MLX_RANK, "0"), (MLX_HOSTFILE, &path)], false);
            assert!(e.contains(want) && e.contains(&path), "{name}: {e}");
        }
        let e = err(CollectiveBackend::Ring, true, &[(MLX_RANK, "3"), (MLX_HOSTFILE, &good)], false);
        assert!(e.contains("MLX_RANK = 3 is not below the group's size 3"), "{e}");
        let e = err(CollectiveBackend::Ring, true, &[(MLX_RANK, "one"), (MLX_HOSTFILE, &good)], false);
        assert!(e.contains("MLX_RANK = \"one\" is not a non-negative integer"), "{e}");
        let missing =
            check(CollectiveBackend::Ring, true, &[(MLX_RANK, "0"), (MLX_HOSTFILE, "/nonexistent/h.json")], false);
        let e = missing.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Io);
        assert!(e.to_string().starts_with("MLX_HOSTFILE = \"/nonexistent/h.json\""), "{e}");
    }

    #[test]
    fn nccl_environments_are_checked() {
        let base = [(MLX_RANK, "1"), (MLX_WORLD_SIZE, "2"), (NCCL_HOST_IP, "127.0.0.1"), (NCCL_PORT, "29500")];
        let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
            let mut v = base.to_vec();
            for &(k, value) in extra {
                v.retain(|(n, _)| *n != k);
                v.push((k, value));
            }
            v
        };
        let ok = check(CollectiveBackend::Nccl, true, &with(&[(CUDA_VISIBLE_DEVICES, "3")]), true).unwrap();
        assert_eq!(ok, Plan::Join(Membership { backend: CollectiveBackend::Nccl, rank: 1, size: 2 }));
        assert_eq!(check(CollectiveBackend::Any, false, &with(&[(CUDA_VISIBLE_DEVICES, "3")]), true).unwrap(), ok);
        let e = err(CollectiveBackend::Nccl, true, &base, true);
        assert!(e.contains("CUDA_VISIBLE_DEVICES must name exactly one GPU"), "{e}");
        let e = err(CollectiveBackend::Nccl, true, &with(&[(CUDA_VISIBLE_DEVICES, "0,1")]), true);
        assert!(e.contains("\"0,1\""), "{e}");
        // One process needs no device rule.
        let one = with(&[(MLX_RANK, "0"), (MLX_WORLD_SIZE, "1")]);
        assert_eq!(
            check(CollectiveBackend::Nccl, true, &one, true).unwrap(),
            Plan::Join(Membership { backend: CollectiveBackend::Nccl, rank: 0, size: 1 })
        );
        assert!(
            err(CollectiveBackend::Nccl, true, &with(&[(MLX_WORLD_SIZE, "0")]), true).contains("MLX_WORLD_SIZE = 0")
        );
        assert!(err(CollectiveBackend::Nccl, true, &with(&[(NCCL_PORT, "70000")]), true).contains("NCCL_PORT = 70000"));
        assert!(
            err(CollectiveBackend::Nccl, true, &with(&[(MLX_RANK, "2")]), true).contains("MLX_RANK = 2 is not below")
        );
        // The CPU build has no NCCL, whatever the environment says.
        assert!(err(CollectiveBackend::Nccl, true, &base, false).contains("no nccl back-end"));
    }
}
