//! The fused gate·up·SwiGLU of a coded MLP on MLX's CUDA back-end: one launch reads the gate
//! and up codes of the same output rows and writes `silu(x · Wg) ⊙ (x · Wu)` in the activation
//! dtype.

use crate::array::MlxArray;
use crate::error::{unserved, Result};
use crate::trellis::linear::TrellisLinear;

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, intermediate]` in `x2`'s dtype.
pub fn swiglu(x2: &MlxArray, gate: &TrellisLinear, up: &TrellisLinear) -> Result<MlxArray> {
    let _ = (x2, up);
    unserved!("the CUDA kernels have no fused gate·up·SwiGLU for {}", gate.geometry())
}
