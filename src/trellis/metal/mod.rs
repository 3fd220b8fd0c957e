//! The Metal kernels on Apple GPUs, one file per kernel family: the upstream down-projection
//! families (axis 0, with the upstream names), the gate/up families (axis 1: `gate_up_factored`,
//! `gate_up_mma`, each also the fused gate·up·SwiGLU), what they share to register and launch
//! their kernels (`launch.rs`: the launch constants, the registration, the fold of split-K partials),
//! and the dispatch: which family serves `M` activation rows of a geometry (the upstream model
//! graph on axis 0). The kernel texts come from the crate's one table of `kernels/` files
//! (`src/kernel/sources.rs`).

pub(crate) mod launch;

// Each kernel family on its own (public with the `tuning` feature, for tests and benchmarks
// that call one family directly; crate-private otherwise).
crate::tuning_mods! {
    down_factored;
    down_k3_interleaved_factored;
    down_mma;
    down_mma_wide;
    gate_up_factored;
    gate_up_mma;
}

/// The upstream baseline: decoded f32 weights times activations, no factoring (the `tuning`
/// feature; the factored kernels are checked against it).
#[cfg(feature = "tuning")]
pub mod trellis_scatter;

use crate::array::MlxArray;
use crate::error::{unserved, Result};

use super::format::{CodeLayout, TrellisGeometry};
use super::operands::LayerOperands;
use gate_up_factored::MAX_ROWS;

/// The code widths the dispatch ([`serves`], [`forward`]) hands to the Metal kernels: those every
/// family is tested at against the reference. The down families on their own (the `tuning`
/// feature) keep their own, wider rules.
pub const SERVED_BITS: std::ops::RangeInclusive<u32> = 2..=4;

/// Whether some Metal kernel serves `g` (for some row counts): a down kernel on axis 0, a gate/up
/// kernel on axis 1, k in [`SERVED_BITS`].
pub fn serves(g: &TrellisGeometry) -> bool {
    SERVED_BITS.contains(&g.k) && serves_any_bits(g)
}

/// [`serves`] but for the code width.
fn serves_any_bits(g: &TrellisGeometry) -> bool {
    down_factored::supports(g)
        || down_k3_interleaved_factored::supports(g)
        || down_mma::supports(g)
        || down_mma_wide::supports(g)
        || gate_up_factored::supports(g)
        || gate_up_mma::supports(g)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype. Axis 0, by the upstream model-graph dispatch for
/// `M` rows: 1 -> the factored row kernel, 2..3 -> the factored rows kernel, 4..8 -> the MMA
/// kernel, more -> the wide MMA kernel in its planned pass. Axis 1: 1 -> the gate/up factored
/// row kernel, 2..8 -> its rows kernel, more -> the gate/up MMA kernel in its planned pass.
/// [`Error::Unserved`](crate::Error::Unserved) where k is outside [`SERVED_BITS`] or the family
/// for `M` does not serve the geometry.
pub fn forward(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    if !SERVED_BITS.contains(&g.k) {
        unserved!("the Metal kernels serve k 2..=4 (the widths they are tested at), not {g}");
    }
    if g.axis == 1 {
        return match m {
            1 if gate_up_factored::supports(g) => gate_up_factored::gate_up_factored_row(x2, codes, scales, g),
            2..=MAX_ROWS if gate_up_factored::supports(g) => {
                gate_up_factored::gate_up_factored_rows(x2, codes, scales, g)
            }
            _ if m > MAX_ROWS && gate_up_mma::supports(g) => gate_up_mma::gate_up_mma(x2, codes, scales, g),
            _ => unserved!("the Metal kernels serve no {m}-row call of {g}"),
        };
    }
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
        _ => unserved!("the Metal kernels serve no {m}-row call of {g}"),
    }
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, intermediate]` in `x2`'s dtype by one fused Metal kernel
/// that reads both code tensors: 1 row -> the factored row kernel, 2..8 -> the factored rows
/// kernel, more -> the MMA kernel in its planned pass.
/// [`Error::Unserved`](crate::Error::Unserved) where gate and up differ in geometry or the family
/// for `M` does not serve it. `gate` and `up` are their operands (a
/// [`TrellisLinear`](crate::trellis::TrellisLinear) reference gives its own).
pub fn swiglu<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
) -> Result<MlxArray> {
    let (gate, up) = (gate.into(), up.into());
    let (g, m) = (gate.geometry, x2.shape().first().copied().unwrap_or(0));
    if up.geometry != g {
        unserved!("the fused Metal gate·up·SwiGLU needs gate and up of one geometry (gate {g}, up {})", up.geometry);
    }
    let (gc, gs, uc, us) = (gate.codes, gate.scales, up.codes, up.scales);
    match m {
        1 if gate_up_factored::supports(g) => gate_up_factored::swiglu_factored_row(x2, gc, gs, uc, us, g),
        2..=MAX_ROWS if gate_up_factored::supports(g) => gate_up_factored::swiglu_factored_rows(x2, gc, gs, uc, us, g),
        _ if m > MAX_ROWS && gate_up_mma::supports(g) => gate_up_mma::swiglu_mma(x2, gc, gs, uc, us, g),
        _ => unserved!("the fused Metal gate·up·SwiGLU serves no {m}-row call of {g}"),
    }
}

/// [`swiglu`] with the kernel on the CPU simulator.
#[cfg(feature = "metal-sim")]
pub fn swiglu_sim<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
) -> Result<MlxArray> {
    let _sim = crate::sim::MetalSimScope::enter();
    swiglu(x2, gate, up)
}

/// Without the simulator the path cannot run.
#[cfg(not(feature = "metal-sim"))]
pub fn swiglu_sim<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
) -> Result<MlxArray> {
    let _ = (x2, gate.into(), up.into());
    unserved!("the metal-sim path needs the `metal-sim` feature (cargo build --features metal-sim)")
}

/// [`forward`] with every kernel on the CPU simulator.
#[cfg(feature = "metal-sim")]
pub fn forward_sim(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let _sim = crate::sim::MetalSimScope::enter();
    forward(x2, codes, scales, g)
}

/// Without the simulator the path cannot run.
#[cfg(not(feature = "metal-sim"))]
pub fn forward_sim(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let _ = (x2, codes, scales, g);
    unserved!("the metal-sim path needs the `metal-sim` feature (cargo build --features metal-sim)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    #[test]
    fn the_dispatch_refuses_widths_outside_the_tested_ones() {
        // T 128 at k 5..8 (and any T at k 1) fits the down families' own rules.
        for (k, t) in [(1, 256), (5, 128), (8, 128)] {
            let g = TrellisGeometry::row_major(64, 512, k, t, 12, 0).unwrap();
            assert!(!serves(&g), "{g}");
            let x = MlxArray::zeros(&[1, 64], Dtype::Float32).unwrap();
            let codes = MlxArray::zeros(&g.codes_shape(), Dtype::Uint32).unwrap();
            let scales = MlxArray::zeros(&[64], Dtype::Float16).unwrap();
            let e = forward(&x, &codes, &scales, &g).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Unserved, "{e}");
            assert!(e.to_string().contains("k 2..=4"), "{e}");
        }
        assert!(serves(&TrellisGeometry::row_major(64, 512, 3, 256, 12, 0).unwrap()));
    }
}
