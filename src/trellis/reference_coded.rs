//! The f64 reference of layers whose coded axis is rotated or padded (docs/format.md §10): the rotation,
//! the padding and the slice done on the host in f64 around [`forward_f64`], with no rounding
//! anywhere.

use crate::error::{invalid, Result};

use super::format::HostLayer;
use super::reference::forward_f64;
use super::rotation::CodedAxis;

/// The logical `(in, out)` features of `layer` with coded axis `axis`.
pub fn logical_features(layer: &HostLayer, axis: &CodedAxis) -> (usize, usize) {
    let g = &layer.geometry;
    if g.axis == 0 {
        (g.rows, axis.logical)
    } else {
        (axis.logical, g.rows)
    }
}

/// `y = x · W` for `m` rows of logical activations `x` `[m, in]`, where `W` is the layer's
/// logical weight (`decode(codes)` sliced to the logical columns, times `Qᵀ` along the coded
/// axis): `[m, out]`, all in f64.
pub fn forward_coded_f64(x: &[f64], m: usize, layer: &HostLayer, axis: &CodedAxis) -> Result<Vec<f64>> {
    let g = &layer.geometry;
    axis.check(g.cols, g.t as usize)?;
    let (inf, outf) = logical_features(layer, axis);
    if m.checked_mul(inf) != Some(x.len()) {
        invalid!("reference forward: x has {} values, expected [{m}, {inf}]", x.len());
    }
    let n = axis.logical;
    if g.axis == 1 {
        // The stored matrix takes x · Q, padded with zeros to the stored columns.
        let mut xs = vec![0f64; m * g.cols];
        for (dst, src) in xs.chunks_exact_mut(g.cols).zip(x.chunks_exact(n)) {
            dst[..n].copy_from_slice(src);
            if let Some(r) = &axis.rotation {
                r.rotate_f64(&mut dst[..n])?;
            }
        }
        forward_f64(&xs, m, &layer.codes, &layer.scales, g)
    } else {
        let ys = forward_f64(x, m, &layer.codes, &layer.scales, g)?;
        let mut y = vec![0f64; m * outf];
        for (dst, src) in y.chunks_exact_mut(n).zip(ys.chunks_exact(g.cols)) {
            dst.copy_from_slice(&src[..n]);
            if let Some(r) = &axis.rotation {
                r.inverse_f64(dst)?;
            }
        }
        Ok(y)
    }
}

/// `down(silu(x · Wg) ⊙ (x · Wu))` for `m` rows in f64, each projection with its coded axis.
pub fn mlp_coded_f64(x: &[f64], m: usize, layers: [(&HostLayer, &CodedAxis); 3]) -> Result<Vec<f64>> {
    let h = swiglu_coded_f64(x, m, layers[0], layers[1])?;
    forward_coded_f64(&h, m, layers[2].0, layers[2].1)
}

/// `silu(x · Wg) ⊙ (x · Wu)` for `m` rows in f64, each projection with its coded axis.
pub fn swiglu_coded_f64(
    x: &[f64],
    m: usize,
    gate: (&HostLayer, &CodedAxis),
    up: (&HostLayer, &CodedAxis),
) -> Result<Vec<f64>> {
    let g = forward_coded_f64(x, m, gate.0, gate.1)?;
    let u = forward_coded_f64(x, m, up.0, up.1)?;
    if g.len() != u.len() {
        invalid!("reference SwiGLU: gate gives {} values and up {}", g.len(), u.len());
    }
    Ok(g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect())
}
