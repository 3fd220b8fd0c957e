//! Down projections on the GPU: which custom kernel serves `M` activation rows of a geometry.

use crate::array::MlxArray;
use crate::error::{invalid, Result};

use super::down_cuda;
use super::expand::generic_forward_f32;
use super::geometry::{CodeLayout, TrellisGeometry};
use super::linear::Path;
use super::{down_factored, down_k3_interleaved_factored, down_mma, down_mma_wide};

/// Whether `path` has a kernel for geometry `g` (any row count).
pub(crate) fn serves(path: Path, g: &TrellisGeometry) -> bool {
    match path {
        Path::Cuda => down_cuda::supports(g),
        Path::Metal | Path::MetalSim => metal_serves(g),
        _ => false,
    }
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype by the kernels of `path`.
pub(crate) fn forward(
    path: Path,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    match path {
        Path::Cuda if down_cuda::supports(g) => down_cuda::down_cuda(x2, codes, scales, g),
        Path::Metal => metal_forward(x2, codes, scales, g),
        Path::MetalSim => metal_sim_forward(x2, codes, scales, g),
        _ => invalid!("the {path} path has no kernel for {g}"),
    }
}

/// Whether some Metal down kernel serves `g` (axis 0; for some row counts).
fn metal_serves(g: &TrellisGeometry) -> bool {
    down_factored::supports(g)
        || down_k3_interleaved_factored::supports(g)
        || down_mma::supports(g)
        || down_mma_wide::supports(g)
}

/// The seed's model-graph dispatch for `M` rows: 1 -> the factored row kernel, 2..3 -> the
/// factored rows kernel, 4..8 -> the MMA kernel, more -> the wide MMA kernel in its planned pass.
/// Where the chosen kernel does not serve the geometry, the generic MLX path runs.
fn metal_forward(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    let interleaved = g.layout() == CodeLayout::K3Interleaved;
    match m {
        1 if interleaved && down_k3_interleaved_factored::supports(g) => {
            down_k3_interleaved_factored::down_k3_interleaved_factored_row(x2, codes, scales, g)
        }
        1 if down_factored::supports(g) => down_factored::down_factored_row(x2, codes, scales, g),
        2..=3 if interleaved && down_k3_interleaved_factored::supports(g) => {
            down_k3_interleaved_factored::down_k3_interleaved_factored_rows(x2, codes, scales, g)
        }
        2..=3 if down_factored::supports(g) => down_factored::down_factored_rows(x2, codes, scales, g),
        4..=8 if interleaved && down_mma::supports(g) => down_mma::down_k3_interleaved_mma(x2, codes, scales, g),
        4..=8 if down_mma::supports(g) => down_mma::down_mma(x2, codes, scales, g),
        9.. if interleaved && down_mma_wide::supports(g) => {
            down_mma_wide::down_k3_interleaved_mma_wide(x2, codes, scales, g)
        }
        9.. if down_mma_wide::supports(g) => down_mma_wide::down_mma_wide(x2, codes, scales, g),
        _ => generic_forward_f32(x2, codes, scales, g)?.astype(x2.dtype()),
    }
}

/// [`metal_forward`] with every kernel on the CPU simulator.
#[cfg(feature = "metal-sim")]
fn metal_sim_forward(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let _sim = crate::sim::MetalSimScope::enter();
    metal_forward(x2, codes, scales, g)
}

/// Without the simulator the path cannot run.
#[cfg(not(feature = "metal-sim"))]
fn metal_sim_forward(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let _ = (x2, codes, scales, g);
    invalid!("the metal-sim path needs the `metal-sim` feature (cargo build --features metal-sim)")
}
