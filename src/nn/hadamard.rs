//! The Walsh–Hadamard transform along the last axis (MLX's `hadamard_transform`).

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::error::{invalid, Result};

/// `x · H · scale` along the last axis, `H` the unnormalized Hadamard matrix of that axis'
/// length `n` (`scale = 1/√n` makes it orthonormal and its own inverse). MLX serves `n = m · 2^k`
/// with `m` in {1, 12, 20, 28}; for a blocked transform reshape the axis into `[.., blocks, b]`.
pub fn hadamard_transform(x: &MlxArray, scale: f32) -> Result<MlxArray> {
    let Some(&n) = x.shape().last() else {
        invalid!("hadamard_transform: needs at least one dimension");
    };
    let served = [1usize, 12, 20, 28].iter().any(|&m| n % m == 0 && (n / m).is_power_of_two());
    if !served {
        invalid!("hadamard_transform: last axis of {n} is not m · 2^k with m in {{1, 12, 20, 28}}");
    }
    if !scale.is_finite() {
        invalid!("hadamard_transform: scale must be finite, got {scale}");
    }
    let scale = sys::mlx_optional_float { value: scale, has_value: true };
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_hadamard_transform(res, x.as_raw(), scale, s) })
}
