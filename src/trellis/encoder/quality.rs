//! How good a coding is: the relative error that the encoder's callers report and gate on, and
//! the rows that were coded as zeros.

use crate::error::{invalid, Result};

use super::Encoded;

/// The quality of an [`Encoded`] against the stored matrix it coded ([`quality`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quality {
    /// Mean squared error over mean squared weight: 0 for an exact coding (an all-zero matrix
    /// codes exactly), about `2^(-2k)` for Gaussian weights, 1 for a matrix decoded as zeros.
    pub relative_mse: f64,
    /// The bound it is gated on, [`RELATIVE_MSE_BOUND`].
    pub bound: f64,
    /// Stored rows that are all zeros (scale 0, decoded exactly).
    pub zero_rows: usize,
    /// Stored rows that are not all zeros but got scale 0 because their scale falls below f16's
    /// normal range: they decode to zeros (see the encoder's module docs).
    pub flushed_rows: usize,
}

impl Quality {
    /// Whether the relative error is below [`RELATIVE_MSE_BOUND`] (a NaN never is).
    pub fn passes(&self) -> bool {
        self.relative_mse < self.bound
    }
}

/// The relative mean squared error every coding must stay under, at any bit width: a coding
/// must keep more than half of the matrix. It separates a coding that works from one that lost
/// the matrix (decoding to zeros gives exactly 1, decoding to noise more) without failing real
/// weights: the Viterbi reaches 1.1 to 2 times the distortion-rate bound `2^(-2k)` on Gaussian
/// rows at `L >= 8` for `k <= 4` (0.31 at `k = 1`, 0.088 at `k = 2`), while rows with heavy
/// tails, whose outliers the 1MAD code clips, stay around 0.15 to 0.3 at `k >= 2` (0.47 at
/// `k = 1` for the cube of Gaussian values).
pub const RELATIVE_MSE_BOUND: f64 = 0.5;

/// The relative error of `encoded` against `weights`, the stored matrix `[rows, cols]` it coded
/// (row-major), and how many of its rows were coded as zeros.
pub fn quality(weights: &[f32], encoded: &Encoded) -> Result<Quality> {
    let g = encoded.layer.geometry;
    let (rows, cols) = (g.rows, g.cols);
    if rows.checked_mul(cols) != Some(weights.len()) || encoded.reconstruction.len() != weights.len() {
        invalid!(
            "quality: {} weights and {} reconstructed values for the coded [{rows}, {cols}]",
            weights.len(),
            encoded.reconstruction.len()
        );
    }
    let power = weights.iter().map(|&w| f64::from(w) * f64::from(w)).sum::<f64>() / weights.len().max(1) as f64;
    let relative_mse = if power > 0.0 {
        encoded.mse / power
    } else if encoded.mse == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    let (mut zero_rows, mut flushed_rows) = (0, 0);
    for (row, scale) in weights.chunks_exact(cols.max(1)).zip(&encoded.layer.scales) {
        if scale.to_f32() == 0.0 {
            if row.iter().all(|&w| w == 0.0) {
                zero_rows += 1;
            } else {
                flushed_rows += 1;
            }
        }
    }
    Ok(Quality { relative_mse, bound: RELATIVE_MSE_BOUND, zero_rows, flushed_rows })
}
