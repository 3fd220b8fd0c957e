//! Trellis-coded weights: the format, the reference decoder, and the paths that run coded layers.
//!
//! One file per concern, with the seed's names: [`geometry`], [`codebook`], [`launch`],
//! [`reference`](mod@reference) (the plain-Rust decoder every kernel is checked against),
//! [`synthetic`], [`expand`] (the generic MLX path), [`linear`] (the module and its dispatch),
//! [`artifact`] (model directories), [`encoder`] (dense weights to codes). One file per kernel
//! family: the seed's Metal kernels [`down_factored`], [`down_k3_interleaved_factored`],
//! [`down_mma`], [`down_mma_wide`], their baseline [`trellis_scatter`], and the CUDA kernels
//! [`down_cuda`] (fused decode and tensor-core multiply) and [`expand_cuda`] (dense weights for
//! MLX's matmul when many rows share a layer).

pub mod artifact;
pub mod codebook;
mod down;
pub mod down_cuda;
pub mod down_factored;
pub mod down_k3_interleaved_factored;
pub mod down_mma;
pub mod down_mma_wide;
pub mod encoder;
pub mod expand;
pub mod expand_cuda;
pub mod geometry;
pub mod json;
pub mod launch;
pub mod linear;
pub mod reference;
pub mod synthetic;
pub mod trellis_scatter;
pub mod viterbi_cuda;

pub use artifact::{write_artifact, Artifact, ModuleConfig};
pub use geometry::{CodeLayout, TrellisGeometry};
pub use linear::{Path, TrellisLinear};
pub use synthetic::{synthetic_layer, HostLayer};
