//! Tensor parallelism over MLX's distributed engine (`mlx::core::distributed` through mlx-c):
//! a safe [`Group`], collectives on [`MlxArray`](crate::MlxArray) ([`all_sum`], [`all_gather`],
//! `all_max`, `all_min`) and [`ShardedMlp`], a coded MLP split by stored rows across processes
//! with one all-reduce per MLP.
//!
//! MLX does the communication; nothing here is a transport. Its back-ends
//! ([`CollectiveBackend`]; the device back-end is [`crate::Backend`]): the **ring** (TCP,
//! collectives on the CPU; MLX's CPU and macOS builds), **NCCL** (MLX's CUDA build, collectives
//! on the GPU) and **MPI** (Open MPI, started by `mpirun`). A process learns its place in the
//! group from environment variables, which [`Group::init`] checks before MLX reads them ([`env`](mod@env)
//! lists them):
//!
//! | back-end | variables |
//! |---|---|
//! | ring | `MLX_RANK`, `MLX_HOSTFILE` (JSON: one list of `"host:port"` per rank, at least two ranks) |
//! | nccl | `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT` (rank 0 listens there); one GPU per process through `CUDA_VISIBLE_DEVICES` |
//! | mpi | set by Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`) |
//!
//! [`launcher`] starts the processes of a group on one machine (the examples' and tests' way to
//! run one).
//!
//! ```no_run
//! use std::rc::Rc;
//! use mlx_trellis::distributed::{CollectiveBackend, Group, ShardedMlp};
//! use mlx_trellis::trellis::{Artifact, ForwardPath};
//! # fn main() -> mlx_trellis::Result<()> {
//! # let x = mlx_trellis::MlxArray::zeros(&[1, 5120], mlx_trellis::Dtype::Bfloat16)?;
//! let group = Rc::new(Group::init(CollectiveBackend::Any, true)?); // from the environment
//! let model = Artifact::open("path/to/model")?;
//! // Only this rank's rows of the three projections are read from disk.
//! let mlp = ShardedMlp::from_artifact(&model, "model.layers.0.mlp", group)?;
//! let y = mlp.forward(&x, ForwardPath::Auto)?;                   // the whole MLP's output
//! # Ok(())
//! # }
//! ```
//!
//! [`all_sum`]: crate::MlxArray::all_sum
//! [`all_gather`]: crate::MlxArray::all_gather

mod backend;
mod collectives;
pub mod env;
mod group;
pub mod launcher;
mod mlp;
mod setup;
mod stop_signals;

pub use backend::{is_available, CollectiveBackend};
pub use group::Group;
pub use mlp::{bf16_tp_gate, ShardedMlp};
pub use setup::{DEFAULT_SETUP_TIMEOUT, MLX_TRELLIS_SETUP_TIMEOUT};
