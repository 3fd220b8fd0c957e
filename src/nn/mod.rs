//! The MLX operations a transformer decoder needs beyond [`MlxArray`](crate::MlxArray)'s own:
//! MLX's fused kernels ([`fast`]: RMSNorm, rotary embedding, attention), the Walsh–Hadamard
//! transform ([`hadamard`]), and gathering, reductions over the vocabulary and sampling
//! ([`select`]). Each runs lazily on the thread's current stream and returns MLX's failures (and
//! this crate's own refusals) as [`Error`](crate::Error) values, like the rest of the binding.

pub mod fast;
pub mod hadamard;
pub mod select;

pub use fast::{rms_norm, rope, scaled_dot_product_attention, AttentionMask};
pub use hadamard::hadamard_transform;

use std::ffi::c_int;

use crate::error::{invalid, Result};

/// Resolves `axis` against `ndim` (negative axes count from the end) and checks it.
pub(crate) fn axis(axis: i32, ndim: usize, what: &str) -> Result<c_int> {
    let resolved = if axis < 0 { i64::from(axis) + ndim as i64 } else { i64::from(axis) };
    if resolved < 0 || resolved >= ndim as i64 {
        invalid!("{what}: axis {axis} is out of range for an array of {ndim} dimensions");
    }
    Ok(resolved as c_int)
}
