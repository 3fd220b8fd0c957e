//! Custom GPU kernels: thin safe wrappers over mlx-c's `mlx_fast_metal_kernel_*` and
//! `mlx_fast_cuda_kernel_*`.
//!
//! As in MLX, a kernel is only a *body*: MLX generates the signature from the input and output
//! names, the arrays' types and the template arguments (see MLX's `metal_kernel` and
//! `cuda_kernel`). A kernel object is built once ([`MetalKernel::new`], [`CudaKernel::new`]) and
//! applied many times with a [`LaunchConfig`]; each application returns lazy output arrays. A CUDA
//! launch applied many times can be checked and converted once ([`CudaKernel::prepare`]).
//!
//! Custom kernels never run on MLX's CPU back-end. A Metal kernel can be *created* anywhere and
//! fails at apply without Metal; a CUDA kernel fails at creation on a build without CUDA. With the
//! `metal-sim` feature, [`MetalKernel`] can also run on a CPU simulator of MLX's Metal wrapping
//! (see `MetalSimScope`), for testing the exact kernel text on machines without a Mac.
//!
//! One file per concern: [`KernelSource`] and [`LaunchConfig`] (`source`), the Metal and CUDA
//! wrappers (`metal`, `cuda`), what both hand to mlx-c (`apply`), the compaction of CUDA text
//! (`compact`) and its files for MLX to `#include` (`include`), the sections and variants of kernel files (`variant`), the one registry every
//! kernel family registers its kernels through (`registry`) and the one table of the kernel files
//! under `kernels/` (`sources`).

mod apply;
pub(crate) mod compact;
mod cuda;
mod include;
mod metal;
pub(crate) mod registry;
mod source;
pub(crate) mod sources;
pub(crate) mod variant;

pub(crate) use cuda::LaunchBounds;
pub use cuda::{CudaKernel, CudaLaunch};
pub use metal::MetalKernel;
pub use source::{KernelSource, LaunchConfig, OutputSpec, TemplateArg};
