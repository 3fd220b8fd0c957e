//! Model artifacts on disk (spec §5): reading coded modules from a model directory and writing
//! one.

mod artifact;
mod paths;

pub use artifact::{write_artifact, Artifact, ModuleConfig};
