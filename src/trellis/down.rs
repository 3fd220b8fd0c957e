//! Down projections on the GPU: which custom kernel serves `M` activation rows of a geometry.

use crate::array::MlxArray;
use crate::error::{invalid, Result};

use super::geometry::TrellisGeometry;
use super::linear::Path;

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype by the kernels of `path`.
pub(crate) fn forward(path: Path, x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let _ = (x2, codes, scales);
    invalid!("the {path} path is not available for {g}")
}
