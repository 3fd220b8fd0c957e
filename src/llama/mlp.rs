//! The SwiGLU MLP of a decoder block: `down(silu(gate(x)) ⊙ up(x))`.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::trellis::cuda::FoldCounters;
use crate::trellis::TrellisMlp;

use super::linear::Linear;

/// A block's MLP: three linear layers, or a [`TrellisMlp`] when all three are trellis-coded in one
/// artifact (its gate and up projections then run as one fused call where the back-end has one).
#[derive(Debug, Clone)]
pub enum Mlp {
    /// Three independent layers.
    Linears {
        /// `gate_proj` (`[intermediate, hidden]`).
        gate: Linear,
        /// `up_proj` (`[intermediate, hidden]`).
        up: Linear,
        /// `down_proj` (`[hidden, intermediate]`).
        down: Linear,
    },
    /// The three projections trellis-coded together.
    Trellis(TrellisMlp),
}

impl Mlp {
    /// `silu(gate(x)) ⊙ up(x)`: the down projection's input.
    pub fn swiglu(&self, x: &MlxArray) -> Result<MlxArray> {
        match self {
            Mlp::Linears { gate, up, .. } => gate.forward(x)?.silu()?.multiply(&up.forward(x)?),
            Mlp::Trellis(m) => m.swiglu_with(x, crate::trellis::ForwardPath::Auto),
        }
    }

    /// `down(h)` for the SwiGLU output `h`.
    pub fn down(&self, h: &MlxArray) -> Result<MlxArray> {
        match self {
            Mlp::Linears { down, .. } => down.forward(h),
            Mlp::Trellis(m) => m.down().forward(h),
        }
    }

    /// The whole MLP (a [`TrellisMlp`] by [`TrellisMlp::forward`], which may join gate and up
    /// to the down projection without forming `swiglu(x)` itself).
    pub fn forward(&self, x: &MlxArray) -> Result<MlxArray> {
        match self {
            Mlp::Linears { .. } => self.down(&self.swiglu(x)?),
            Mlp::Trellis(m) => m.forward(x),
        }
    }

    /// `residual + forward(x)`, the residual stream after the MLP (a [`TrellisMlp`] by
    /// [`TrellisMlp::forward_residual`], which may run the add in the down projection's launch).
    pub fn forward_residual(&self, x: &MlxArray, residual: &MlxArray) -> Result<MlxArray> {
        match self {
            Mlp::Linears { .. } => residual.add(&self.forward(x)?),
            Mlp::Trellis(m) => m.forward_residual(x, residual),
        }
    }

    /// The fold counters [`Mlp::forward_residual_fed`] takes for `rows` rows of `dtype`
    /// activations ([`TrellisMlp::fed_counters`]); `None` where it does not run fed.
    pub fn fed_counters(&self, rows: usize, dtype: Dtype) -> Option<usize> {
        match self {
            Mlp::Linears { .. } => None,
            Mlp::Trellis(m) => m.fed_counters(rows, dtype),
        }
    }

    /// [`Mlp::forward_residual`] with gate and up's launch taking its fold counters from
    /// `counters` ([`TrellisMlp::forward_residual_fed`]); an error where it does not run fed.
    pub fn forward_residual_fed(
        &self,
        x: &MlxArray,
        residual: &MlxArray,
        counters: &mut FoldCounters,
    ) -> Result<MlxArray> {
        match self {
            Mlp::Linears { .. } => invalid!("an MLP of separate layers does not run fed"),
            Mlp::Trellis(m) => m.forward_residual_fed(x, residual, counters),
        }
    }

    /// The three layers' stored bits and logical weights, in the order gate, up, down.
    pub fn stored_bits(&self) -> [(u64, u64); 3] {
        match self {
            Mlp::Linears { gate, up, down } => [gate.stored_bits(), up.stored_bits(), down.stored_bits()],
            Mlp::Trellis(m) => [m.gate(), m.up(), m.down()].map(|t| Linear::Trellis(t.clone()).stored_bits()),
        }
    }
}
