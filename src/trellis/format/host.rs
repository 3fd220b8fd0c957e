//! [`HostLayer`]: a coded layer held on the host (codes, scales and their geometry).

use half::f16;

use super::geometry::TrellisGeometry;

/// A coded layer held on the host: codes in the geometry's layout and one f16 scale per row.
#[derive(Debug, Clone)]
pub struct HostLayer {
    /// The code words (`geometry.codes_shape()`).
    pub codes: Vec<u32>,
    /// One scale per stored row.
    pub scales: Vec<f16>,
    /// The geometry of the codes.
    pub geometry: TrellisGeometry,
}
