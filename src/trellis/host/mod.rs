//! The host path: coded products in multi-threaded Rust on the CPU, reading MLX's evaluated
//! arrays in place.
//!
//! MLX offers custom kernels on Metal and CUDA only, so on its CPU back-end the coded layers
//! would otherwise run on the [generic path](crate::trellis::generic), which builds every
//! weight of every call out of MLX operations (a few passes over 64-bit temporaries per weight)
//! and then multiplies with MLX's matmul. Here each block is decoded once per pass of up to 16
//! activation rows, eight stored rows a step in SIMD lanes (`lanes.rs`), and multiplied straight
//! into the outputs (`product.rs`): the weights never exist in memory. A layer's rotation and
//! padding run on the host too (`axes.rs`), and a whole MLP is one call (`mlp.rs`): each call
//! evaluates its activations once (a synchronisation point in MLX's lazy graph, a round trip to
//! MLX's CPU stream) and returns a new array.

mod axes;
mod lanes;
mod mlp;
mod product;

use rayon::prelude::*;

use crate::array::{MlxArray, SharedArray};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::trellis::checks::check_layer;
use crate::trellis::format::TrellisGeometry;
use crate::trellis::rotation::CodedAxis;

/// A layer's operands as the host path reads them: the codes evaluated and read in place, the
/// scales in f32, the coded axis's rotation and padding. Made once per layer (its first host
/// call), so that each call evaluates only its activations.
pub struct HostOperands {
    geometry: TrellisGeometry,
    /// The coded axis, where it is not the identity.
    axis: Option<CodedAxis>,
    codes: SharedArray,
    scales: Vec<f32>,
}

impl HostOperands {
    /// Checks and evaluates stored `codes` (uint32 in `g`'s layout) and `scales` (float16, one
    /// per stored row, finite), with the layer's coded `axis` (its stored columns: the inputs on
    /// axis 1, the outputs on axis 0).
    pub fn new(codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry, axis: &CodedAxis) -> Result<HostOperands> {
        g.validate()?;
        check_layer("host path", codes, scales, g)?;
        axis.check(g.cols, g.t as usize)?;
        let scales = scales.astype(Dtype::Float32)?.to_vec::<f32>()?;
        if let Some((row, s)) = scales.iter().enumerate().find(|(_, s)| !s.is_finite()) {
            invalid!("host path: the scale of stored row {row} of {g} is {s}; scales must be finite");
        }
        let axis = (!axis.is_identity(g.cols)).then(|| axis.clone());
        Ok(HostOperands { geometry: *g, axis, codes: codes.share()?, scales })
    }

    /// The logical input features.
    pub fn in_features(&self) -> usize {
        match &self.axis {
            Some(a) if self.geometry.axis == 1 => a.logical,
            _ => self.geometry.in_features(),
        }
    }

    /// The logical output features.
    pub fn out_features(&self) -> usize {
        match &self.axis {
            Some(a) if self.geometry.axis == 0 => a.logical,
            _ => self.geometry.out_features(),
        }
    }

    /// `x [m, in] · W -> [m, out]` in f32 on the host, logical features in and out: `x` rotated
    /// and padded first on axis 1, the stored outputs sliced and rotated back on axis 0.
    pub fn product(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let (g, n) = (&self.geometry, self.in_features());
        if m.checked_mul(n) != Some(x.len()) {
            invalid!("host path: {} activations are not {m} rows of the {n} inputs of {g}", x.len());
        }
        let codes = self.codes.as_slice::<u32>()?;
        match &self.axis {
            Some(a) if g.axis == 1 => {
                product::product(&axes::stored_input(x, m, a, g.cols)?, m, codes, &self.scales, g)
            }
            Some(a) => axes::logical_output(product::product(x, m, codes, &self.scales, g)?, m, a, g.cols),
            None => product::product(x, m, codes, &self.scales, g),
        }
    }

    /// `x2 [m, in] · W -> [m, out]` in `x2`'s dtype (f32 inside), logical features in and out.
    pub fn forward(&self, x2: &MlxArray) -> Result<MlxArray> {
        let m = self.rows_of(x2)?;
        let y = self.product(&activations(x2)?, m)?;
        output(&y, m, self.out_features(), x2.dtype())
    }

    /// Checks `x2` is `[m, in]`; returns `m`.
    fn rows_of(&self, x2: &MlxArray) -> Result<usize> {
        match x2.shape()[..] {
            [m, n] if n == self.in_features() => Ok(m),
            ref s => invalid!("host path: activations {s:?} must be [M, {}] for {}", self.in_features(), self.geometry),
        }
    }
}

/// `silu(gate(x2)) ⊙ up(x2)` for `x2 [m, hidden]`, in `x2`'s dtype: one evaluation, both
/// products and the SwiGLU on the host in f32.
pub(crate) fn swiglu_forward(gate: &HostOperands, up: &HostOperands, x2: &MlxArray) -> Result<MlxArray> {
    let m = gate.rows_of(x2)?;
    let x = activations(x2)?;
    let h = rayon::scope(|_| mlp::swiglu(gate, up, &x, m))?;
    output(&h, m, gate.out_features(), x2.dtype())
}

/// `down(silu(gate(x2)) ⊙ up(x2))` for `x2 [m, hidden]`, in `x2`'s dtype: one evaluation, the
/// whole MLP on the host in f32 (inside rayon's pool, entered once).
pub(crate) fn mlp_forward(
    gate: &HostOperands,
    up: &HostOperands,
    down: &HostOperands,
    x2: &MlxArray,
) -> Result<MlxArray> {
    let m = gate.rows_of(x2)?;
    let x = activations(x2)?;
    let y = rayon::scope(|_| mlp::mlp(gate, up, down, &x, m))?;
    output(&y, m, down.out_features(), x2.dtype())
}

/// `x2 · W` for each of `layers` (which share their input), in `x2`'s dtype: one evaluation,
/// the products side by side on the host.
pub(crate) fn shared_input_forward(layers: &[&HostOperands], x2: &MlxArray) -> Result<Vec<MlxArray>> {
    let Some(first) = layers.first() else {
        return Ok(Vec::new());
    };
    let m = first.rows_of(x2)?;
    for l in &layers[1..] {
        l.rows_of(x2)?;
    }
    let x = activations(x2)?;
    let ys = rayon::scope(|_| layers.par_iter().map(|l| l.product(&x, m)).collect::<Result<Vec<_>>>())?;
    ys.iter().zip(layers).map(|(y, l)| output(y, m, l.out_features(), x2.dtype())).collect()
}

/// The values of `x2` in f32 (evaluates it).
fn activations(x2: &MlxArray) -> Result<Vec<f32>> {
    match x2.dtype() {
        Dtype::Float32 => x2.to_vec::<f32>(),
        _ => x2.astype(Dtype::Float32)?.to_vec::<f32>(),
    }
}

/// `y` as an `[m, n]` array of `dtype`.
fn output(y: &[f32], m: usize, n: usize, dtype: Dtype) -> Result<MlxArray> {
    let y = MlxArray::from_slice(y, &[m, n])?;
    match dtype {
        Dtype::Float32 => Ok(y),
        dtype => y.astype(dtype),
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
