//! # mlx-trellis
//!
//! Trellis-quantized (QTIP-style, 1MAD code) LLM weights on [MLX], from Rust: a thin safe binding
//! over mlx-c ([`MlxArray`], operations, safetensors, custom [`MetalKernel`] and [`CudaKernel`]
//! objects) and the trellis kernels that run coded layers on Apple GPUs (Metal), NVIDIA GPUs
//! (MLX's CUDA back-end) and, through MLX's own operations, on any CPU.
//!
//! Every fallible call returns [`Result`], whose [`Error`] a runner can match on: MLX's own
//! failures keep MLX's message, refused arguments, unserved geometries and artifact problems say
//! what and where. MLX's default error handler, which would exit the process, is never reached:
//! this crate installs its own before the first mlx-c call.
//!
//! ```
//! use mlx_trellis::trellis::reference::{forward_f64, rel_err};
//! use mlx_trellis::trellis::{synthetic_layer, CodeLayout, TrellisLinear};
//! use mlx_trellis::{Dtype, MlxArray};
//!
//! # fn main() -> mlx_trellis::Result<()> {
//! // A seeded 3-bit down projection, 512 inputs -> 1024 outputs, in the block interleave.
//! let host = synthetic_layer(512, 1024, 3, 12, 0, CodeLayout::K3Interleaved, 0.02, 7)?;
//! let layer = TrellisLinear::from_host("down_proj", &host)?;
//! let x: Vec<f32> = (0..2 * 512).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
//! let y = layer.forward(&MlxArray::from_slice(&x, &[2, 512])?)?; // the best path here
//! assert_eq!((y.shape(), y.dtype()), (vec![2, 1024], Dtype::Float32));
//!
//! // Every path is checked against the plain-Rust f64 reference.
//! let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
//! let want = forward_f64(&xr, 2, &host.codes, &host.scales, &host.geometry)?;
//! let got: Vec<f64> = y.to_vec::<f32>()?.into_iter().map(f64::from).collect();
//! assert!(rel_err(&got, &want)? < 1e-5);
//! # Ok(())
//! # }
//! ```
//!
//! [MLX]: https://github.com/ml-explore/mlx
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

/// Declares modules that are public with the `tuning` feature and crate-private without it.
macro_rules! tuning_mods {
    ($($name:ident;)*) => {
        $(
            #[cfg(feature = "tuning")]
            pub mod $name;
            #[cfg(not(feature = "tuning"))]
            pub(crate) mod $name;
        )*
    };
}
pub(crate) use tuning_mods;

mod alloc;
mod array;
mod device;
pub mod distributed;
mod dtype;
mod error;
mod ffi;
mod files;
mod io;
mod json;
mod kernel;
pub mod llama;
mod memory;
pub mod nn;
mod ops;
mod process;
#[cfg(feature = "metal-sim")]
mod sim;
pub mod trellis;

pub use array::{MlxArray, SharedArray};
pub use device::{
    active_memory, backend, clear_cache, peak_memory, reset_peak_memory, seed, synchronize, Backend, Device,
    DeviceType, Stream, StreamScope,
};
pub use dtype::{Dtype, Element};
pub use error::{Error, ErrorKind, Result};
pub use files::open_regular_file;
pub use io::gguf::{GgmlType, Gguf, GgufTensor, GGUF_GROUP_SIZE};
pub use io::{load_safetensors, save_safetensors, Safetensors};
pub use kernel::{CudaKernel, CudaLaunch, KernelSource, LaunchConfig, MetalKernel, OutputSpec, TemplateArg};
pub use memory::available_memory;
pub use ops::{async_eval_all, concatenate, dequantize, eval_all, quantize, quantized_matmul, random};
pub use process::{exit_process, skip_static_destructors_at_exit};
#[cfg(feature = "metal-sim")]
pub use sim::MetalSimScope;

pub use half::{bf16, f16};
