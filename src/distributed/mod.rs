//! Tensor parallelism over MLX's distributed engine (`mlx::core::distributed` through mlx-c):
//! a safe [`Group`], collectives on [`MlxArray`](crate::MlxArray) ([`all_sum`], [`all_gather`],
//! `all_max`, `all_min`).
//!
//! MLX does the communication; nothing here is a transport. Its back-ends ([`Backend`]): the
//! **ring** (TCP, collectives on the CPU; MLX's CPU and macOS builds), **NCCL** (MLX's CUDA
//! build, collectives on the GPU) and **MPI** (Open MPI, started by `mpirun`). A process learns
//! its place in the group from environment variables, which [`Group::init`] checks before MLX
//! reads them ([`env`] lists them):
//!
//! | back-end | variables |
//! |---|---|
//! | ring | `MLX_RANK`, `MLX_HOSTFILE` (JSON: one list of `"host:port"` per rank, at least two ranks) |
//! | nccl | `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT` (rank 0 listens there); one GPU per process through `CUDA_VISIBLE_DEVICES` |
//! | mpi | set by Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`) |
//!
//! [`all_sum`]: crate::MlxArray::all_sum
//! [`all_gather`]: crate::MlxArray::all_gather

mod backend;
mod collectives;
pub mod env;
mod group;

pub use backend::{is_available, Backend};
pub use group::Group;
