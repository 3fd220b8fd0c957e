//! [`LayerOperands`]: what a back-end's kernels read for one coded projection (its codes, scales
//! and geometry), borrowed. The back-ends (`cuda/`, `metal/`) take operands, never a
//! [`TrellisLinear`](super::TrellisLinear), so the layer types depend on the back-ends and not
//! the reverse.

use crate::array::MlxArray;

use super::format::TrellisGeometry;

/// One coded projection's operands, borrowed: its codes (uint32 in the geometry's layout), its
/// scales (float16, one per stored row) and their geometry. The kernels check that they fit
/// each other before launching.
#[derive(Debug, Clone, Copy)]
pub struct LayerOperands<'a> {
    /// The code tensor.
    pub codes: &'a MlxArray,
    /// The per-row scales.
    pub scales: &'a MlxArray,
    /// The geometry the codes are stored in.
    pub geometry: &'a TrellisGeometry,
}

impl<'a> LayerOperands<'a> {
    /// Operands from their parts.
    pub fn new(codes: &'a MlxArray, scales: &'a MlxArray, geometry: &'a TrellisGeometry) -> Self {
        LayerOperands { codes, scales, geometry }
    }
}
