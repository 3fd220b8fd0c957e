//! # mlx-trellis
//!
//! Trellis-quantized (QTIP-style, 1MAD code) LLM weights on [MLX], from Rust: a thin safe binding
//! over mlx-c ([`MlxArray`], operations, safetensors, custom [`MetalKernel`] and [`CudaKernel`]
//! objects) and the trellis kernels that run coded layers on Apple GPUs (Metal), NVIDIA GPUs
//! (MLX's CUDA back-end) and, through MLX's own operations, on any CPU.
//!
//! Every fallible call returns [`Result`] (an [`anyhow::Result`]); failures MLX reports keep
//! MLX's message ([`Error`]), and MLX's default handler, which would exit the process, is never
//! reached.
//!
//! [MLX]: https://github.com/ml-explore/mlx
#![deny(missing_docs)]

mod array;
mod device;
mod dtype;
mod error;
mod io;
mod kernel;
mod ops;
#[cfg(feature = "metal-sim")]
mod sim;
pub mod trellis;

pub use array::{MlxArray, SharedArray};
pub use device::{active_memory, backend, clear_cache, seed, Backend, Device, DeviceType, Stream, StreamScope};
pub use dtype::{Dtype, Element};
pub use error::{Error, ErrorKind, Result};
pub use io::{load_safetensors, save_safetensors, Safetensors};
pub use kernel::{CudaKernel, KernelSource, LaunchConfig, MetalKernel, OutputSpec, TemplateArg};
pub use ops::{concatenate, dequantize, eval_all, quantize, quantized_matmul, random};
#[cfg(feature = "metal-sim")]
pub use sim::MetalSimScope;

pub use half::{bf16, f16};
