//! MLX's Walsh–Hadamard transform.

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::error::{invalid, Result};

/// `x · H_n · scale` over the last dimension of `x` (length `n`), where `H_n` is the Sylvester
/// Hadamard matrix of natural order (`H[i][j] = (-1)^popcount(i & j)`, symmetric) for `n` a power
/// of two (MLX also serves `n = 2^a · m` for `m` in 12, 20, 28 with its own matrices). `scale`
/// defaults to `1/√n`, which makes the transform orthonormal. Floating-point inputs only; MLX
/// computes in the input's dtype.
pub fn hadamard_transform(x: &MlxArray, scale: Option<f32>) -> Result<MlxArray> {
    if let Some(s) = scale {
        if !s.is_finite() {
            invalid!("hadamard_transform: scale {s} is not finite");
        }
    }
    let scale = sys::mlx_optional_float { value: scale.unwrap_or(0.0), has_value: scale.is_some() };
    // SAFETY: `x` is a live handle for the duration of the call; `scale` is passed by value.
    MlxArray::op(|res, s| unsafe { sys::mlx_hadamard_transform(res, x.as_raw(), scale, s) })
}
