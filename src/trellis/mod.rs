//! Trellis-coded weights: the format, the reference decoder, and the paths that run coded layers.
//!
//! A folder per job and per back-end: [`format`](mod@format) (geometry, codebook, code layouts, host layers),
//! [`reference`](mod@reference) (the plain-Rust decoder every kernel is checked against),
//! [`synthetic`] (seeded layers and activations), [`generic`] (the path made of MLX operations,
//! for every back-end), [`host`] (the CPU's multi-threaded SIMD kernel), [`linear`] (one coded projection and the choice of path), [`mlp`] (a coded MLP), [`metal`] (the upstream
//! Metal kernel families, one file each, with the upstream names), [`cuda`] (the CUDA kernels),
//! [`encoder`] (dense weights to codes), [`model`] (artifacts on disk), [`shard`] (tensor-parallel
//! shards of an MLP by stored rows), and a layer's coded axis (docs/format.md §10): [`rotation`]
//! (the incoherence rotation and the padding), [`transform`] (their application at run time on
//! MLX) and [`reference_coded`] (the f64 reference with them). The layer types depend on the
//! back-ends, never the reverse: `cuda/` and `metal/` take [`LayerOperands`] (codes, scales,
//! geometry), and every check of a layer's operands is in `checks.rs`.

pub(crate) mod checks;
pub mod cuda;
pub mod encoder;
pub mod format;
pub mod generic;
pub mod host;
pub mod linear;
pub mod metal;
pub mod mlp;
pub mod model;
pub(crate) mod operands;
pub mod reference;
pub mod reference_coded;
pub mod rotation;
pub mod shard;
pub mod synthetic;
pub mod transform;

pub use format::{CodeLayout, HostLayer, TrellisGeometry};
pub use linear::{ForwardPath, TrellisLinear};
pub use mlp::TrellisMlp;
pub use model::{check_artifact_dir, write_artifact, Artifact, ModuleConfig};
pub use operands::LayerOperands;
pub use rotation::{CodedAxis, Rotation};
pub use shard::{RowShard, SHARD_ROW_MULTIPLE};
pub use synthetic::{synthetic_layer, synthetic_layer_in_blocks, synthetic_mlp, synthetic_mlp_axis_one};
