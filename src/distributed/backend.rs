//! [`CollectiveBackend`]: which of MLX's communication back-ends a [`Group`](super::Group) runs
//! on, and [`is_available`]. (The device back-end, Metal, CUDA or CPU, is [`crate::Backend`].)

use std::ffi::CString;
use std::fmt;
use std::str::FromStr;

use mlx_sys as sys;

use crate::error::{Error, Result};
use crate::ffi::call_value;

/// One of MLX's communication back-ends (MLX 0.32's `mlx::core::distributed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveBackend {
    /// The first back-end whose environment is set, in MLX's order: NCCL (on MLX's CUDA build),
    /// then the ring, then MPI.
    Any,
    /// TCP sockets in a ring (CPU and macOS builds; collectives run on the CPU). Reads `MLX_RANK`
    /// and `MLX_HOSTFILE`.
    Ring,
    /// NVIDIA's NCCL (MLX's CUDA build; collectives run on the GPU). Reads `MLX_RANK`,
    /// `MLX_WORLD_SIZE`, `NCCL_HOST_IP` and `NCCL_PORT`.
    Nccl,
    /// Open MPI, loaded by MLX at run time (`libmpi.so`, or `MLX_MPI_LIBNAME`); the processes are
    /// started by `mpirun`.
    Mpi,
}

impl CollectiveBackend {
    /// Every back-end, for listings.
    pub const ALL: [CollectiveBackend; 4] =
        [CollectiveBackend::Any, CollectiveBackend::Ring, CollectiveBackend::Nccl, CollectiveBackend::Mpi];

    /// MLX's name for it (`"any"`, `"ring"`, `"nccl"`, `"mpi"`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveBackend::Any => "any",
            CollectiveBackend::Ring => "ring",
            CollectiveBackend::Nccl => "nccl",
            CollectiveBackend::Mpi => "mpi",
        }
    }

    /// Whether its collectives run on the CPU (MLX computes them on a CPU stream).
    pub(crate) fn runs_on_cpu(self) -> bool {
        matches!(self, CollectiveBackend::Ring | CollectiveBackend::Mpi)
    }

    pub(crate) fn c_name(self) -> CString {
        CString::new(self.name()).expect("back-end names hold no NUL byte")
    }
}

impl fmt::Display for CollectiveBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CollectiveBackend {
    type Err = Error;

    fn from_str(s: &str) -> Result<CollectiveBackend> {
        CollectiveBackend::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<_> = CollectiveBackend::ALL.iter().map(|b| b.name()).collect();
            Error::invalid(format!("unknown distributed back-end {s:?}; expected one of {}", names.join(", ")))
        })
    }
}

/// Whether the loaded MLX library has `backend` (for [`CollectiveBackend::Any`]: any of them). The
/// ring is in MLX's CPU and macOS builds, NCCL in its CUDA build; MPI is available where Open
/// MPI's library can be loaded. Being available says nothing of the environment a group needs.
pub fn is_available(backend: CollectiveBackend) -> bool {
    let name = backend.c_name();
    // SAFETY: `name` is a NUL-terminated string that outlives the call; MLX only reads it.
    call_value(|| unsafe { sys::mlx_distributed_is_available(name.as_ptr()) }).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_cpu_build_has_the_ring() {
        for b in CollectiveBackend::ALL {
            assert_eq!(b.name().parse::<CollectiveBackend>().unwrap(), b);
        }
        let e = "gloo".parse::<CollectiveBackend>().unwrap_err();
        assert!(e.to_string().contains("any, ring, nccl, mpi"), "{e}");
        if crate::backend() == crate::Backend::Cpu {
            assert!(is_available(CollectiveBackend::Ring));
            assert!(is_available(CollectiveBackend::Any));
            assert!(!is_available(CollectiveBackend::Nccl));
        }
    }
}
