//! Checks of a call's operands that every kernel path makes before launching: a wrong operand
//! would read out of bounds on the GPU.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Error, Result};

use super::format::TrellisGeometry;

/// Checks what the seed's checks leave open (a wrong operand would read out of bounds on the
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
