//! Every check of a coded layer's operands, in one place: the code tensor against its format
//! parameters ([`check_codes`]), the scales ([`check_scales`]), a caller's activations
//! ([`activation_rows`]), and what every kernel path checks before launching
//! ([`check_operands`], [`check_layer`]): a wrong operand would read out of bounds on the GPU.

use half::f16;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Error, Result};

use super::format::TrellisGeometry;

/// Checks a code tensor (uint32, either layout) against the format parameters and derives its
/// geometry.
pub(crate) fn check_codes(name: &str, codes: &MlxArray, k: u32, t: u32, l: u32, axis: u32) -> Result<TrellisGeometry> {
    if codes.dtype() != Dtype::Uint32 {
        invalid!("trellis codes {name:?} are {}, expected uint32", codes.dtype());
    }
    TrellisGeometry::from_codes_shape(name, &codes.try_shape()?, k, t, l, axis)
}

/// Checks the scales of the codes `name`: float16 `[rows]`, every one finite (one NaN or
/// infinite scale would make every output it reaches non-finite).
pub(crate) fn check_scales(name: &str, scales: &MlxArray, g: &TrellisGeometry, codes: &MlxArray) -> Result<()> {
    if scales.dtype() != Dtype::Float16 {
        invalid!("trellis scales of {name:?} are {}, expected float16", scales.dtype());
    }
    if scales.try_shape()? != [g.rows] {
        invalid!(
            "trellis scales of {name:?} have shape {:?}, expected [{}] (one per stored row of codes {:?})",
            scales.shape(),
            g.rows,
            codes.shape()
        );
    }
    let values = scales.to_vec::<f16>()?;
    if let Some((row, s)) = values.iter().enumerate().find(|(_, s)| !s.is_finite()) {
        invalid!("trellis scales of {name:?}: the scale of stored row {row} is {s}; scales must be finite");
    }
    Ok(())
}

/// `x` as `[m, features]` rows (checked: at least one dimension, `features` last, a float
/// dtype), and its leading dimensions. Messages start `who: ` and name the taker `the {noun}`,
/// followed by ` ({g})` where a geometry is given.
pub(crate) fn activation_rows(
    who: &str,
    noun: &str,
    x: &MlxArray,
    features: usize,
    g: Option<&TrellisGeometry>,
) -> Result<(MlxArray, Vec<usize>)> {
    let shape = x.shape();
    let Some((&inf, lead)) = shape.split_last() else {
        invalid!("{who}: activations must have at least one dimension, got a scalar");
    };
    if inf != features {
        let of = g.map_or(String::new(), |g| format!(" ({g})"));
        invalid!("{who}: activations of shape {shape:?} have {inf} features, the {noun} takes {features}{of}");
    }
    if !matches!(x.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        invalid!("{who}: activations are {}, expected float32, float16 or bfloat16", x.dtype());
    }
    let m: usize = lead.iter().product();
    Ok((x.reshape(&[m, inf])?, lead.to_vec()))
}

/// Checks every kernel path makes before launching (a wrong operand would read out of bounds on the
/// GPU): `x2` is `[M >= 1, in_features]` (the stored rows on axis 0, the stored columns on axis
/// 1) in f32/f16/bf16, `codes` and `scales` fit `g`. Returns `M`.
pub(crate) fn check_operands(
    what: &str,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<usize> {
    let shape = x2.shape();
    if shape.len() != 2 || shape[0] == 0 || shape[1] != g.in_features() {
        invalid!("{what}: activations {shape:?} must be [M >= 1, {}]", g.in_features());
    }
    let dtype = x2.dtype();
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        invalid!("{what}: activations are {dtype}, expected float32, float16 or bfloat16");
    }
    check_layer(what, codes, scales, g)?;
    Ok(shape[0])
}

/// Checks that `codes` (uint32 in `g`'s layout) and `scales` (f16, one per stored row) fit `g`.
pub(crate) fn check_layer(what: &str, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<()> {
    if codes.shape() != g.codes_shape()
        || codes.dtype() != Dtype::Uint32
        || scales.shape() != [g.rows]
        || scales.dtype() != Dtype::Float16
    {
        invalid!(
            "{what}: codes {} {:?} / scales {} {:?} do not match {g} (uint32 {:?} / float16 [{}])",
            codes.dtype(),
            codes.shape(),
            scales.dtype(),
            scales.shape(),
            g.codes_shape(),
            g.rows
        );
    }
    Ok(())
}

/// A value as a template int.
pub(crate) fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("{what}: {v} does not fit a template int")))
}

/// Whether `gate` and `up` are the same geometry but for their bit widths: what a fused
/// gate·up·SwiGLU kernel needs (both read for the same output rows over the same inputs, with
/// the same blocks and state width).
pub(crate) fn same_but_bits(gate: &TrellisGeometry, up: &TrellisGeometry) -> bool {
    *up == TrellisGeometry { k: up.k, ..*gate }
}

/// An error unless `residual` is `[m, out]` in `x2`'s dtype: a residual stream added to a
/// kernel's output `[m, out]` in its launch, before the output's one rounding.
pub(crate) fn check_residual(what: &str, x2: &MlxArray, residual: &MlxArray, m: usize, out: usize) -> Result<()> {
    let (shape, dtype) = (residual.shape(), residual.dtype());
    if shape != [m, out] || dtype != x2.dtype() {
        invalid!("{what}: residual {dtype} {shape:?} must be {} [{m}, {out}], as the output", x2.dtype());
    }
    Ok(())
}
