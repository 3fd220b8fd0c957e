//! Coding a dense linear layer as a runner loads it (docs/format.md §10): the coded axis chosen by the
//! rule for dimensions that are not whole blocks, the seeded rotation of the coded axis, and the
//! zero padding of a coded axis that is not whole blocks.
//!
//! # The axis rule
//!
//! A matrix `W [out, in]` is coded along a dimension that is a multiple of `T` (256) when one
//! exists, preferring the conventional axis (`EncoderConfig::axis`: 1, coded along the inputs,
//! for gate/up/q/k/v/o projections; 0, coded along the outputs, for down projections). When
//! neither dimension is a multiple of `T`, the conventional axis is coded and zero-padded to the
//! next multiple of `T`. SmolLM2-135M (hidden 576, MLP 1536, 3 KV heads of 64): gate and up
//! `[1536, 576]` are coded on axis 0 (along their 1536 outputs), down `[576, 1536]` on axis 1
//! (along its 1536 inputs), with no padding; the attention projections (576 and 192 wide) are
//! coded on axis 1 along their 576 inputs, padded to 768.

use crate::error::{invalid, Result};
use crate::trellis::format::HostLayer;
use crate::trellis::linear::TrellisLinear;
use crate::trellis::rotation::{CodedAxis, Rotation};

use super::{encode_padded, stored_from_linear, EncoderConfig, Quality, BLOCK_LEN, RELATIVE_MSE_BOUND};

/// A seeded random-sign block Hadamard rotation of the coded axis ([`Rotation::seeded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationSpec {
    /// The seed of the signs.
    pub seed: u64,
}

/// Where a dense `W [out, in]` is coded (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisChoice {
    /// 0: stored `Wᵀ [in, out]`, coded along the outputs; 1: stored `W [out, in]`, coded along
    /// the inputs.
    pub axis: u32,
    /// The logical length of the coded axis.
    pub logical: usize,
    /// The stored length of the coded axis (`logical` rounded up to a whole number of blocks).
    pub stored: usize,
}

/// The coded axis of a dense `W [out_features, in_features]` under the rule of the module
/// documentation, with `conventional` the preferred axis and `t` the block length.
pub fn choose_axis(out_features: usize, in_features: usize, conventional: u32, t: usize) -> Result<AxisChoice> {
    if conventional > 1 {
        invalid!("choose_axis: axis {conventional} must be 0 or 1");
    }
    if t == 0 || out_features == 0 || in_features == 0 {
        invalid!("choose_axis: W [{out_features}, {in_features}] with blocks of {t} has nothing to code");
    }
    let coded_len = |axis: u32| if axis == 0 { out_features } else { in_features };
    let axis = if coded_len(conventional) % t == 0 || coded_len(1 - conventional) % t != 0 {
        conventional
    } else {
        1 - conventional
    };
    let logical = coded_len(axis);
    let Some(stored) = logical.div_ceil(t).checked_mul(t) else {
        invalid!("choose_axis: {logical} columns padded to blocks of {t} overflow");
    };
    Ok(AxisChoice { axis, logical, stored })
}

/// The block length that codes a dense `W [out_features, in_features]` without padding where
/// [`BLOCK_LEN`] cannot: [`BLOCK_LEN`] when [`choose_axis`] finds an axis of whole 256-weight
/// blocks, else the longest multiple of 32 below it that divides an axis (preferring
/// `conventional`; 576 → 192, 192 → 192), else [`BLOCK_LEN`] (the axis is padded). Multiples of
/// 32 make whole 32-bit words at every k; on Gaussian weights T 192 codes within 0.1 % of
/// T 256's error (docs/encoder.md). The GPU kernels serve T 256, and along the outputs (axis 0)
/// any multiple of 64 up to it (docs/format.md §10.3).
pub fn fitting_block_len(out_features: usize, in_features: usize, conventional: u32) -> Result<u32> {
    let fits = |t: u32| -> Result<bool> {
        let c = choose_axis(out_features, in_features, conventional, t as usize)?;
        Ok(c.stored == c.logical)
    };
    if fits(BLOCK_LEN)? {
        return Ok(BLOCK_LEN);
    }
    for t in (1..BLOCK_LEN / 32).rev().map(|i| i * 32) {
        if fits(t)? {
            return Ok(t);
        }
    }
    Ok(BLOCK_LEN)
}

/// A dense linear layer coded by [`code_linear`].
#[derive(Debug, Clone)]
pub struct CodedLinear {
    /// The stored matrix's codes, scales and geometry (padded columns included).
    pub layer: HostLayer,
    /// The coded axis: rotation and logical length.
    pub coded_axis: CodedAxis,
    /// Mean squared error of the decoded logical weights (rotation undone) against the input
    /// `W`, in f64, over the `out * in` logical weights.
    pub mse: f64,
    /// Mean of `w²` over the input `W`, for a relative error `mse / mean_square`.
    pub mean_square: f64,
    /// Stored rows of the input that are all zeros (coded exactly, scale 0).
    pub zero_rows: usize,
}

impl CodedLinear {
    /// `mse / mean_square` (0 for an all-zero `W`, which codes exactly).
    pub fn relative_mse(&self) -> f64 {
        if self.mean_square > 0.0 {
            self.mse / self.mean_square
        } else if self.mse == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    }

    /// The relative error against [`RELATIVE_MSE_BOUND`] and the stored rows coded as zeros, as
    /// [`quality`](super::quality) reports them for a plain coding.
    pub fn quality(&self) -> Quality {
        let scale_zero = self.layer.scales.iter().filter(|s| s.to_f32() == 0.0).count();
        Quality {
            relative_mse: self.relative_mse(),
            bound: RELATIVE_MSE_BOUND,
            zero_rows: self.zero_rows,
            flushed_rows: scale_zero.saturating_sub(self.zero_rows),
        }
    }

    /// The layer on the device, named `name`.
    pub fn to_linear(&self, name: &str) -> Result<TrellisLinear> {
        TrellisLinear::from_host_coded(name, &self.layer, self.coded_axis.clone())
    }
}

/// Codes a dense `w` `[out_features, in_features]` (row-major) as a runner loads it: on the axis
/// [`choose_axis`] picks with `cfg.axis` as the conventional one, each stored row rotated along
/// the coded axis by `cfg.rotation` (`v ↦ v · Q`), zero-padded to whole blocks and coded with the
/// padding free ([`encode_padded`]). `cfg.layout` must suit the chosen axis (the 3-bit
/// interleave needs axis 0 and a padded length that is a multiple of 512). `progress(rows_done,
/// rows)` as in [`encode_with_progress`](super::encode_with_progress).
pub fn code_linear(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    cfg: &EncoderConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CodedLinear> {
    cfg.validate()?;
    let choice = choose_axis(out_features, in_features, cfg.axis, cfg.t as usize)?;
    let coding = EncoderConfig { axis: choice.axis, rotation: None, ..*cfg };
    coding.validate()?;
    let (stored, rows, n) = stored_from_linear(w, out_features, in_features, choice.axis)?;
    let rotation = cfg.rotation.map(|r| Rotation::seeded(n, r.seed)).transpose()?;
    let encoded = match &rotation {
        Some(r) => {
            let mut rotated = stored.clone();
            r.rotate_rows(&mut rotated)?;
            encode_padded(&rotated, rows, n, &coding, progress)?
        }
        None => encode_padded(&stored, rows, n, &coding, progress)?,
    };
    // The error of the weights a runner computes with: the decoded logical columns, rotated
    // back in f64, against the input.
    let cols = encoded.layer.geometry.cols;
    let mut sq = 0f64;
    let mut row = vec![0f64; n];
    for (dec, orig) in encoded.reconstruction.chunks_exact(cols).zip(stored.chunks_exact(n)) {
        row.iter_mut().zip(&dec[..n]).for_each(|(r, &d)| *r = f64::from(d));
        if let Some(r) = &rotation {
            r.inverse_f64(&mut row)?;
        }
        sq += row.iter().zip(orig).map(|(&d, &o)| (d - f64::from(o)).powi(2)).sum::<f64>();
    }
    let count = (rows * n) as f64;
    let mean_square = stored.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / count;
    let zero_rows = stored.chunks_exact(n).filter(|row| row.iter().all(|&v| v == 0.0)).count();
    Ok(CodedLinear {
        layer: encoded.layer,
        coded_axis: CodedAxis { rotation, logical: n },
        mse: sq / count,
        mean_square,
        zero_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_rule() {
        let c = |o, i, a| {
            let ch = choose_axis(o, i, a, 256).unwrap();
            (ch.axis, ch.logical, ch.stored)
        };
        // SmolLM2: gate/up [1536, 576] and down [576, 1536]; attention 576 x 576, 192 x 576.
        assert_eq!(c(1536, 576, 1), (0, 1536, 1536));
        assert_eq!(c(576, 1536, 0), (1, 1536, 1536));
        assert_eq!(c(576, 576, 1), (1, 576, 768));
        assert_eq!(c(192, 576, 1), (1, 576, 768));
        // Qwen: both multiples, the conventional axis is kept.
        assert_eq!(c(17408, 5120, 1), (1, 5120, 5120));
        assert_eq!(c(5120, 17408, 0), (0, 5120, 5120));
        assert!(choose_axis(4, 4, 2, 256).is_err());
        assert!(choose_axis(0, 4, 1, 256).is_err());
    }
}
