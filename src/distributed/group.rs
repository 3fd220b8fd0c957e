//! [`Group`]: the processes that communicate, as MLX's distributed back-end formed them.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use mlx_sys as sys;

use crate::device::{backend as gpu_backend, Backend as GpuBackend};
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::ffi::{call, call_value};

use super::backend::{is_available, CollectiveBackend};
use super::env::{plan, Env, Plan};
use super::setup::{setup_timeout, waits_for, SetupWatchdog};

/// A group of processes that run collectives together (MLX's `distributed::Group`).
///
/// Made by [`Group::init`] from the environment the back-end reads (see [`super::env`]), or
/// [`Group::alone`] for this process by itself. A group of one process has no MLX handle: its
/// collectives return their input, as MLX's do for a group of one.
///
/// **Threads.** `Group` is `Send`: the handle is a heap object of MLX's (a reference-counted
/// pointer to the back-end's communicator) with no tie to the thread that made it, so it may move
/// to the thread that uses it. It is not `Sync`: every rank must issue the same collectives in
/// the same order, and two threads of one process issuing them at once would interleave them on
/// the same sockets or NCCL communicator in an order the other ranks cannot match. Share it
/// between layers of one thread with `Rc`. Arrays a collective made keep their own reference to
/// MLX's group, so dropping the `Group` before they are evaluated is sound.
pub struct Group {
    /// MLX's group and its back-end; `None` for a process alone.
    raw: Option<(sys::mlx_distributed_group, CollectiveBackend)>,
    rank: usize,
    size: usize,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the handle owns a heap `mlx::core::distributed::Group` (a `shared_ptr` to the
// back-end's group) that no thread owns and that MLX reads from whatever thread builds a
// collective; `Group` is not `Sync` (the `Cell` marker), so only one thread uses it at a time.
unsafe impl Send for Group {}

impl Group {
    /// The group the environment describes for `backend` (see [`super::env`] for the variables
    /// each reads). With `strict`, a missing environment is an error that names the variables;
    /// without, an environment in which none of the back-end's variables is set gives this
    /// process alone (as MLX does). Once any of its variables is set, a partial environment, a
    /// malformed hostfile, a rank outside the group or a back-end the MLX build lacks is an
    /// [`Error::InvalidArgument`] either way, checked before MLX is called.
    ///
    /// Forming a group blocks until every rank has joined, at most
    /// [`MLX_TRELLIS_SETUP_TIMEOUT`](super::MLX_TRELLIS_SETUP_TIMEOUT) seconds (default 120): past
    /// that, the process prints which rank it waited for at which address and exits with status 2
    /// (MLX's set-up cannot be interrupted, so no error is returned). A failure of MLX's set-up
    /// (an address that cannot be bound, say) is an error naming this rank's addresses. A
    /// launcher should watch its processes and stop the others when one fails. MLX keeps the
    /// first group of each back-end for the life of the process: a later `init` of the same
    /// back-end returns it.
    pub fn init(backend: CollectiveBackend, strict: bool) -> Result<Group> {
        let var = |name: &str| std::env::var(name).ok();
        let cuda = gpu_backend() == GpuBackend::Cuda;
        let env = Env { var: &var, available: &is_available, cuda };
        let context =
            || format!("forming a distributed group ({backend} back-end{})", if strict { ", strict" } else { "" });
        match plan(backend, strict, &env).with_context(context)? {
            Plan::Alone => Ok(Group::alone()),
            Plan::Join(m) => {
                let limit = setup_timeout(&var).with_context(context)?;
                let waiting = waits_for(&m, &var);
                let watchdog = SetupWatchdog::start(limit, waiting.clone());
                let group = Group::init_mlx(m.backend).with_context(|| format!("{}: {waiting}", context()));
                drop(watchdog);
                let group = group?;
                if (group.rank, group.size) != (m.rank, m.size) {
                    let message = format!(
                        "MLX formed a {} group of {} processes with this one as rank {}, but the environment says rank {} of {}",
                        m.backend, group.size, group.rank, m.rank, m.size
                    );
                    return Err(Error::mlx(message).context(context()));
                }
                Ok(group)
            }
        }
    }

    /// This process alone: rank 0 of a group of one, whose collectives return their input.
    pub fn alone() -> Group {
        Group { raw: None, rank: 0, size: 1, _not_sync: PhantomData }
    }

    /// Calls MLX's `distributed::init(strict = true, backend)` on a checked environment.
    fn init_mlx(backend: CollectiveBackend) -> Result<Group> {
        let name = backend.c_name();
        // SAFETY: creating an empty handle has no preconditions; it is freed by `Group`'s `Drop`
        // (or below, on failure).
        let mut raw = call_value(|| unsafe { sys::mlx_distributed_group_new() })?;
        // SAFETY: `raw` is a live, empty handle for MLX to fill; `name` is NUL-terminated and
        // outlives the call.
        if let Err(e) = call(|| unsafe { sys::mlx_distributed_init(&mut raw, true, name.as_ptr()) }) {
            // SAFETY: `raw` is owned here and freed exactly once (freeing an empty handle is a
            // no-op).
            unsafe { sys::mlx_distributed_group_free(raw) };
            return Err(e);
        }
        Group::wrap(raw, backend)
    }

    /// Takes ownership of a filled handle and reads its rank and size.
    fn wrap(raw: sys::mlx_distributed_group, backend: CollectiveBackend) -> Result<Group> {
        // Owned from here: `Drop` frees it whatever fails below.
        let mut group = Group { raw: Some((raw, backend)), rank: 0, size: 1, _not_sync: PhantomData };
        // SAFETY: `raw` is a live, filled group handle.
        let rank = call_value(|| unsafe { sys::mlx_distributed_group_rank(raw) })?;
        // SAFETY: as above.
        let size = call_value(|| unsafe { sys::mlx_distributed_group_size(raw) })?;
        match (usize::try_from(rank), usize::try_from(size)) {
            (Ok(r), Ok(s)) if r < s => (group.rank, group.size) = (r, s),
            _ => invalid!("MLX's {backend} group reports rank {rank} of {size}"),
        }
        Ok(group)
    }

    /// This process's rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The back-end, or `None` for a process alone.
    pub fn backend(&self) -> Option<CollectiveBackend> {
        self.raw.map(|(_, b)| b)
    }

    /// The sub-group of the processes that pass the same `color`, ranked by `key` (by their rank
    /// here where `key` is `None`). Every process of the group must call it. MLX 0.32's ring
    /// cannot split (an [`Error::Mlx`]); NCCL and MPI can. A process alone splits into itself.
    pub fn split(&self, color: i32, key: Option<i32>) -> Result<Group> {
        let Some((raw, backend)) = self.raw else {
            return Ok(Group::alone());
        };
        if color < 0 {
            invalid!("split: color {color} must be non-negative");
        }
        // SAFETY: creating an empty handle has no preconditions; `wrap` or the error path frees it.
        let mut out = call_value(|| unsafe { sys::mlx_distributed_group_new() })?;
        let key = key.unwrap_or(-1);
        // SAFETY: `out` is a live, empty handle to fill and `raw` a live group.
        if let Err(e) = call(|| unsafe { sys::mlx_distributed_group_split(&mut out, raw, color, key) }) {
            // SAFETY: `out` is owned here and freed exactly once.
            unsafe { sys::mlx_distributed_group_free(out) };
            return Err(e.context(format!("splitting the {backend} group of {} processes", self.size)));
        }
        Group::wrap(out, backend)
    }

    /// MLX's handle and its back-end, or `None` for a process alone.
    pub(crate) fn raw(&self) -> Option<(sys::mlx_distributed_group, CollectiveBackend)> {
        self.raw
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some((raw, _)) = self.raw.take() {
            // SAFETY: the handle is owned by this value and freed exactly once.
            unsafe { sys::mlx_distributed_group_free(raw) };
        }
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backend() {
            Some(b) => write!(f, "Group({b}, rank {} of {})", self.rank, self.size),
            None => f.write_str("Group(alone, rank 0 of 1)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_alone_is_rank_zero_of_one_and_splits_into_itself() {
        let g = Group::alone();
        assert_eq!((g.rank(), g.size(), g.backend()), (0, 1, None));
        let s = g.split(3, None).unwrap();
        assert_eq!((s.rank(), s.size()), (0, 1));
        assert_eq!(format!("{g:?}"), "Group(alone, rank 0 of 1)");
        fn send<T: Send>() {}
        send::<Group>();
    }
}
