//! The host path: coded products in multi-threaded Rust on the CPU, reading MLX's evaluated
//! arrays in place.
//!
//! MLX offers custom kernels on Metal and CUDA only, so on its CPU back-end the coded layers
//! would otherwise run on the [generic path](crate::trellis::generic), which builds every
//! weight of every call out of MLX operations (a few passes over 64-bit temporaries per weight)
//! and then multiplies with MLX's matmul. Here each block is decoded once per pass of up to 16
//! activation rows, eight stored rows a step in SIMD lanes (`lanes.rs`), and multiplied straight
//! into the outputs (`product.rs`): the weights never exist in memory. The call evaluates its
//! activations (a synchronisation point in MLX's lazy graph) and returns a new array.

mod lanes;
mod product;

use crate::array::{MlxArray, SharedArray};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::trellis::checks::check_layer;
use crate::trellis::format::TrellisGeometry;

/// A layer's operands as the host path reads them: the codes evaluated and read in place, the
/// scales in f32. Made once per layer (its first host call), so that each call evaluates only
/// its activations: every evaluation is a round trip to MLX's CPU stream.
pub struct HostOperands {
    geometry: TrellisGeometry,
    codes: SharedArray,
    scales: Vec<f32>,
}

impl HostOperands {
    /// Checks and evaluates stored `codes` (uint32 in `g`'s layout) and `scales` (float16, one
    /// per stored row, finite).
    pub fn new(codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<HostOperands> {
        g.validate()?;
        check_layer("host path", codes, scales, g)?;
        let scales = scales.astype(Dtype::Float32)?.to_vec::<f32>()?;
        if let Some((row, s)) = scales.iter().enumerate().find(|(_, s)| !s.is_finite()) {
            invalid!("host path: the scale of stored row {row} of {g} is {s}; scales must be finite");
        }
        Ok(HostOperands { geometry: *g, codes: codes.share()?, scales })
    }

    /// `x2 [m, in] · W -> [m, out]` in `x2`'s dtype (f32 inside).
    pub fn forward(&self, x2: &MlxArray) -> Result<MlxArray> {
        let g = &self.geometry;
        let shape = x2.shape();
        if shape.len() != 2 || shape[1] != g.in_features() {
            invalid!("host path: activations {shape:?} must be [M, {}] for {g}", g.in_features());
        }
        let m = shape[0];
        let x = match x2.dtype() {
            Dtype::Float32 => x2.to_vec::<f32>()?,
            _ => x2.astype(Dtype::Float32)?.to_vec::<f32>()?,
        };
        let y = product::product(&x, m, self.codes.as_slice::<u32>()?, &self.scales, g)?;
        let y = MlxArray::from_slice(&y, &[m, g.out_features()])?;
        match x2.dtype() {
            Dtype::Float32 => Ok(y),
            dtype => y.astype(dtype),
        }
    }
}

/// Random layers of every shape the host path handles, for its tests.
#[cfg(test)]
pub(crate) mod test_layers {
    use half::f16;

    use crate::trellis::format::{HostLayer, TrellisGeometry};
    use crate::trellis::synthetic::{synthetic_layer, SplitMix64};
    use crate::trellis::CodeLayout;

    /// One test layer's code parameters: k, L, T and layout.
    pub(crate) struct LayerCase {
        pub k: u32,
        pub l: u32,
        pub t: u32,
        pub layout: CodeLayout,
        /// Stored columns.
        pub cols: usize,
    }

    const fn case(k: u32, l: u32, t: u32, layout: CodeLayout, cols: usize) -> LayerCase {
        LayerCase { k, l, t, layout, cols }
    }

    /// k 1–8, L from k to 16, T 256 and shorter blocks (windows that wrap around a block of one
    /// word or a few), both layouts (the block interleave is axis 0 only), several blocks a row.
    pub(crate) const LAYER_CASES: [LayerCase; 12] = [
        case(2, 16, 256, CodeLayout::RowMajor, 768),
        case(3, 12, 256, CodeLayout::RowMajor, 512),
        case(3, 12, 256, CodeLayout::K3Interleaved, 1024),
        case(4, 16, 256, CodeLayout::RowMajor, 512),
        case(1, 9, 64, CodeLayout::RowMajor, 320),
        case(2, 2, 16, CodeLayout::RowMajor, 64),
        case(4, 16, 8, CodeLayout::RowMajor, 40),
        case(3, 16, 32, CodeLayout::RowMajor, 96),
        case(8, 16, 4, CodeLayout::RowMajor, 12),
        case(5, 13, 32, CodeLayout::RowMajor, 160),
        case(6, 16, 16, CodeLayout::RowMajor, 96),
        case(7, 16, 32, CodeLayout::RowMajor, 64),
    ];

    /// A seeded random layer of `rows` stored rows on `axis` for `case`.
    pub(crate) fn random_layer(rows: usize, case: &LayerCase, axis: u32, seed: u64) -> HostLayer {
        if case.t == 256 {
            return synthetic_layer(rows, case.cols, case.k, case.l, axis, case.layout, 0.02, seed).unwrap();
        }
        let geometry = TrellisGeometry::row_major(rows, case.cols, case.k, case.t, case.l, axis).unwrap();
        let mut rng = SplitMix64::new(seed);
        let codes = (0..geometry.code_words()).map(|_| rng.next_u32()).collect();
        let scales = (0..rows).map(|_| f16::from_f64(0.02 * (0.3 * rng.next_gaussian()).exp())).collect();
        HostLayer { codes, scales, geometry }
    }
}
