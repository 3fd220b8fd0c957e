//! Row norms matched after coding: each stored row's scale set so that the row decodes with the
//! norm of the weights it codes.
//!
//! A search that minimises a row's squared error returns a reconstruction that is shorter than
//! the row: its error is nearly orthogonal to it, so `|ŵ|² ≈ |w|² − |w − ŵ|²`. At k 3 that is
//! 1–2 % of a row's norm (SmolLM2's 210 projections, docs/real-models.md), the same direction in
//! every projection, and the shrinkage adds up through a model's layers into flatter output
//! distributions. Scaling the row back to the input's norm costs a little squared error (about
//! `|w − ŵ|⁴ / 4|w|²`) and no bits: the scale is stored anyway.

use half::f16;

use crate::error::{invalid, Result};
use crate::trellis::format::HostLayer;
use crate::trellis::reference::expand;

/// Sets the scale of each stored row of `layer` so that the row's first `n` decoded columns
/// (the logical ones; past them is padding) have the Euclidean norm of the same row of `target`
/// (`[rows, n]`, the weights the row codes, in any basis its rotation keeps norms in). A row of
/// scale 0, of all-zero target or of all-zero decoded values keeps its scale; a new scale must be
/// a normal f16, else the call is an error and `layer` is unchanged. Returns the mean factor the
/// scales were multiplied by (before f16 rounding) over the rescaled rows.
pub fn match_row_norms(layer: &mut HostLayer, target: &[f32], n: usize) -> Result<f64> {
    let (rows, cols) = (layer.geometry.rows, layer.geometry.cols);
    if n == 0 || n > cols || Some(target.len()) != rows.checked_mul(n) || layer.scales.len() != rows {
        invalid!(
            "match_row_norms: a target of {} values, {} scales and {n} logical of {cols} columns do not fit {rows} stored rows",
            target.len(),
            layer.scales.len()
        );
    }
    let decoded = expand(&layer.codes, &layer.scales, &layer.geometry)?;
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let mut scales = layer.scales.clone();
    let (mut sum, mut count) = (0f64, 0usize);
    for (r, ((dec, want), scale)) in decoded.chunks_exact(cols).zip(target.chunks_exact(n)).zip(&mut scales).enumerate()
    {
        let (have, want) = (norm(&dec[..n]), norm(want));
        if scale.to_f32() == 0.0 || have == 0.0 || want == 0.0 {
            continue;
        }
        let factor = want / have;
        let new = f16::from_f64(scale.to_f64() * factor);
        if !new.is_normal() {
            invalid!("match_row_norms: stored row {r}'s scale {scale} times {factor} is not a normal f16");
        }
        *scale = new;
        sum += factor;
        count += 1;
    }
    layer.scales = scales;
    Ok(if count == 0 { 1.0 } else { sum / count as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::reference::weight_at;
    use crate::trellis::synthetic::synthetic_layer;
    use crate::trellis::CodeLayout;

    #[test]
    fn rescaled_rows_decode_with_the_targets_norms() {
        // Seeded codes, both layouts; targets the decoded rows times a factor per row (0.5-2),
        // so the matched scales are the old ones times those factors, to f16's precision. The
        // norms are checked through `weight_at`, not the `expand` the function uses.
        for (k, layout, seed) in
            [(3, CodeLayout::RowMajor, 1), (3, CodeLayout::K3Interleaved, 2), (2, CodeLayout::RowMajor, 3)]
        {
            let mut layer = synthetic_layer(24, 512, k, 12, 0, layout, 0.05, seed).unwrap();
            layer.scales[5] = f16::ZERO;
            let (rows, n) = (24, 500);
            let decoded = expand(&layer.codes, &layer.scales, &layer.geometry).unwrap();
            let factors: Vec<f32> = (0..rows).map(|r| 0.5 + 1.5 * r as f32 / rows as f32).collect();
            let target: Vec<f32> = (0..rows).flat_map(|r| decoded[r * 512..r * 512 + n].iter().copied()).collect();
            let target: Vec<f32> =
                target.chunks_exact(n).zip(&factors).flat_map(|(row, &f)| row.iter().map(move |&v| v * f)).collect();
            let before = layer.scales.clone();
            let mean = match_row_norms(&mut layer, &target, n).unwrap();
            let want_mean =
                factors.iter().enumerate().filter(|&(r, _)| r != 5).map(|(_, &f)| f64::from(f)).sum::<f64>() / 23.0;
            assert!((mean - want_mean).abs() < 1e-3, "k {k}: mean factor {mean} against {want_mean}");
            assert_eq!(layer.scales[5], f16::ZERO, "a row of scale 0 stays so");
            for r in (0..rows).filter(|&r| r != 5) {
                let g = &layer.geometry;
                let have: f64 = (0..n)
                    .map(|c| f64::from(weight_at(&layer.codes, &layer.scales, g, r, c).unwrap()).powi(2))
                    .sum::<f64>()
                    .sqrt();
                let want: f64 = target[r * n..(r + 1) * n].iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
                // One f16 rounding of the scale: at most 2^-11 relative.
                assert!((have / want - 1.0).abs() <= 4.9e-4, "k {k} row {r}: norm {have} against {want}");
                let ratio = layer.scales[r].to_f64() / before[r].to_f64();
                assert!((ratio / f64::from(factors[r]) - 1.0).abs() <= 1e-3, "k {k} row {r}: scale ratio {ratio}");
            }
        }
    }

    #[test]
    fn targets_of_another_size_and_overflowing_scales_are_refused_and_change_nothing() {
        let mut layer = synthetic_layer(4, 256, 3, 12, 0, CodeLayout::RowMajor, 0.05, 9).unwrap();
        let before = layer.scales.clone();
        let err = match_row_norms(&mut layer, &[1.0; 4 * 255], 256).unwrap_err();
        assert!(err.to_string().contains("do not fit 4 stored rows"), "{err}");
        let err = match_row_norms(&mut layer, &[1.0; 4 * 257], 257).unwrap_err();
        assert!(err.to_string().contains("257 logical of 256"), "{err}");
        // A target 10^8 times the decoded rows' norm: the scale leaves f16's range.
        let decoded = expand(&layer.codes, &layer.scales, &layer.geometry).unwrap();
        let huge: Vec<f32> = decoded.iter().map(|v| v * 1e8).collect();
        let err = match_row_norms(&mut layer, &huge, 256).unwrap_err();
        assert!(err.to_string().contains("is not a normal f16"), "{err}");
        assert_eq!(layer.scales, before);
    }
}
