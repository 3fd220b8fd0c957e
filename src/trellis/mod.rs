//! Trellis-coded weights: the format, the reference decoder, and the paths that run coded layers.
//!
//! One file per concern, with the seed's names: [`geometry`], [`codebook`], [`launch`],
//! [`reference`], [`synthetic`], [`expand`] (the generic MLX path), [`linear`] (the module and
//! its dispatch), [`artifact`] (model directories).

pub mod artifact;
pub mod codebook;
mod down;
pub mod expand;
pub mod geometry;
pub mod json;
pub mod launch;
pub mod linear;
pub mod reference;
pub mod synthetic;

pub use artifact::{write_artifact, Artifact, ModuleConfig};
pub use geometry::{CodeLayout, TrellisGeometry};
pub use linear::{Path, TrellisLinear};
pub use synthetic::{synthetic_layer, HostLayer};
