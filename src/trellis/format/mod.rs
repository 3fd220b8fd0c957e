//! The trellis format (docs/format.md §1-§4): the [`TrellisGeometry`] of a coded matrix, the 1MAD
//! [`codebook`], the two code layouts and their conversions, and [`HostLayer`], a coded layer held
//! on the host.

pub mod codebook;
mod geometry;
mod host;
mod layout;

pub use geometry::{CodeLayout, TrellisGeometry};
pub use host::HostLayer;
pub use layout::{interleaved_to_row_major, row_major_to_interleaved};
