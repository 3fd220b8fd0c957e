//! Model artifacts on disk (docs/format.md §5): reading coded modules (or one rank's rows of them)
//! from a model directory and writing one, with each module's coded axis (docs/format.md §10).

mod artifact;
mod coded_axis;
mod paths;
mod shard;

pub use artifact::{check_artifact_dir, write_artifact, Artifact, ModuleConfig};
