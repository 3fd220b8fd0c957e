//! Axis-1 projections on MLX's CUDA back-end (`kernels/cuda/gate_up.cu`): one coded projection
//! stored `[out, in]` ([`linear`]), or an MLP's gate and up projections of the same rows fused
//! with the SwiGLU ([`swiglu`]: `silu(x · Wg) ⊙ (x · Wu)`). Either is one launch that writes the
//! output in the activation dtype: the reduction runs inside each output row, so no partial
//! sums and no fold.
//!
//! [`linear_residual`] adds a residual stream to one projection's output in the same launch
//! (`residual + x · W`, rounded once): a model's down projection and its residual add.
//!
//! Four kernel files serve the same variants (`AxisOneKernel` in `config.rs`); the
//! plan (`plan.rs`) picks the kernel and its shape for a row count, `launch.rs` registers the
//! kernel file's variant and prepares the launch, and each kernel file says how its work is
//! split:
//! - `gate_up.cu`, the fragment kernel: the warps of a thread block split a row's blocks, each
//!   lane reads its own activations. One row up to the GEMM's threshold, and f32 activations.
//! - `gate_up_gemm.cu`, the decode-once GEMM: the warps own different output tiles and share
//!   the activations, staged in shared memory. From `GEMM_MIN_ROWS` rows of 16-bit activations,
//!   handed over as f16 by the pre-pass (`prescale.cu`).
//! - `gate_up_int8.cu` (the tuning feature only): up to 8 rows of 16-bit activations as two int8
//!   terms on u8 x s8 MMAs; not planned, as it measured no faster.
//! - `gate_up_wgmma.cu` (the tuning feature only): the decode-once GEMM on Hopper's warpgroup
//!   MMA (sm_90a), B read by the tensor cores from shared memory; not planned, as it measured
//!   slower in the MLP chain.
//! - `gate_up_ws.cu`, the warp-specialized GEMM (sm_90a): producer warps decode into shared
//!   memory, a consumer warpgroup multiplies from there, one pass of up to 128 rows, its thread
//!   blocks splitting the work evenly (stream-K). The fused gate·up·SwiGLU from
//!   `WS_FUSED_MIN_ROWS` to `WS_FUSED_MAX_ROWS` rows of 16-bit activations on GPUs with the
//!   warpgroup MMA.
//!
//! From [`CONVERT_MIN_ROWS`] rows, bf16 activations are handed to the fragment kernel as f16,
//! each row multiplied by a power of two into f16's range (one pre-pass launch per call instead
//! of a conversion per row tile of the layer); from [`DENSE_MIN_ROWS`] rows of 16-bit activations
//! the layer is decoded once to dense weights for MLX's matmul instead, but where the plan takes
//! the warp-specialized GEMM.

// The shape and its plan (public with the `tuning` feature, for the sweeps and tests that call the
// kernel with a shape of their own; crate-private otherwise), as Metal's families.
crate::tuning_mods! {
    config;
    plan;
}
mod launch;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, unserved, Result};
use crate::trellis::checks::{check_operands, check_residual, same_but_bits};
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::operands::LayerOperands;

use super::expand::expand_cuda;
use config::{AxisOneConfig, AxisOneKernel};
pub use launch::CONVERT_MIN_ROWS;
use launch::{prepared_launch, Variant};
use plan::plan;

/// Rows of 16-bit activations from which [`linear`] and [`swiglu`] decode the layer to dense
/// weights ([`expand_cuda`]) and run MLX's matmul: the GEMM decodes every weight once per pass of
/// up to 64 rows, the dense path once per call; on an H200 in Qwen3-14B's MLP chain the GEMM's
/// two passes at 128 rows lost to the dense path (docs/cuda-mlp.md, "Where the warps wait"). On
/// GPUs with Hopper's warpgroup MMA [`swiglu`] keeps the warp-specialized GEMM up to
/// `WS_FUSED_MAX_ROWS` rows instead (`plan.rs`).
pub const DENSE_MIN_ROWS: usize = 65;

/// Whether `m` rows of `dtype` activations take the dense path.
pub fn uses_dense(m: usize, dtype: Dtype) -> bool {
    m >= DENSE_MIN_ROWS && dtype != Dtype::Float32
}

/// Whether the kernel serves `g`: axis 1, row-major codes, T = 256, L <= 16, k in 2..=4 (the
/// widths it is tested at against the reference; wider codes are refused as unserved), and at
/// most [`MAX_CODE_WORDS`] code words.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 1
        && g.layout() == CodeLayout::RowMajor
        && g.t == 256
        && g.l <= 16
        && (2..=4).contains(&g.k)
        && g.code_words() <= MAX_CODE_WORDS
}

/// The most code words a matrix may have on the axis-1 kernels, which address them by 32-bit
/// offsets (`axis_one.cuh`): 2^32 − 1, 137 G weights at k 4.
pub const MAX_CODE_WORDS: usize = u32::MAX as usize;

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer.
pub fn linear(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, codes, scales, g)?;
    if uses_dense(m, x2.dtype()) {
        return x2.matmul(&expand_cuda(codes, scales, g, x2.dtype())?.t()?);
    }
    run_linear(x2, codes, scales, g, m, plan(m, x2.dtype(), false, g.out_features()), None)
}

/// `residual + x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer: [`linear`] with
/// the add in the same launch, in f32 before the output is rounded (one rounding where
/// [`linear`] and an add round twice). `residual` is `[M, out]` in `x2`'s dtype. From
/// [`DENSE_MIN_ROWS`] rows of 16-bit activations, MLX's matmul and add.
pub fn linear_residual(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
) -> Result<MlxArray> {
    residual_call(x2, codes, scales, g, residual, None)
}

/// [`linear_residual`] with an explicit shape and never the dense path (the `tuning` feature's
/// `axis_one_residual_with`).
#[cfg(feature = "tuning")]
pub fn linear_residual_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    residual_call(x2, codes, scales, g, residual, Some(cfg))
}

/// [`linear_residual`] by `cfg`, or (`None`) by the plan or the dense path.
fn residual_call(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
    cfg: Option<AxisOneConfig>,
) -> Result<MlxArray> {
    let what = "CUDA axis-1 kernel with a residual";
    let m = check(what, x2, codes, scales, g)?;
    check_residual(what, x2, residual, m, g.out_features())?;
    let cfg = match cfg {
        Some(cfg) => cfg,
        None if uses_dense(m, x2.dtype()) => return residual.add(&linear(x2, codes, scales, g)?),
        None => plan(m, x2.dtype(), false, g.out_features()),
    };
    run_linear(x2, codes, scales, g, m, cfg, Some(residual))
}

/// [`linear`] with an explicit shape (the `tuning` feature's `axis_one_with`).
#[cfg(feature = "tuning")]
pub(crate) fn linear_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, codes, scales, g)?;
    run_linear(x2, codes, scales, g, m, cfg, None)
}

/// The single projection's launch on checked operands of `m` rows, with the residual variant
/// where `residual` is given (checked by the caller).
fn run_linear(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    m: usize,
    cfg: AxisOneConfig,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    let variant = if residual.is_some() { Variant::Residual } else { Variant::Single };
    let prepared = prepared_launch(g, cfg, m, x2.dtype(), variant)?;
    let xs = prepared.kernel_inputs(x2, scales)?;
    let mut inputs: Vec<&MlxArray> = xs.iter().collect();
    inputs.extend([codes, scales]);
    inputs.extend(residual);
    Ok(prepared.kernel.apply_prepared(&inputs, &prepared.launch)?.remove(0))
}

/// Whether the fused kernel serves gate `gate` with up `up`: both served ([`supports`]) and of
/// the same rows, inputs, T, L and layout; their bit widths may differ (artifacts that allocate
/// bits per tensor).
pub fn fuses(gate: &TrellisGeometry, up: &TrellisGeometry) -> bool {
    supports(gate) && supports(up) && same_but_bits(gate, up)
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, intermediate]` in `x2`'s dtype: the gate and up projections
/// of the same rows in one launch, gate and up of the same or different bit widths ([`fuses`]).
/// `gate` and `up` are their operands (a [`TrellisLinear`](crate::trellis::TrellisLinear)
/// reference gives its own).
pub fn swiglu<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
) -> Result<MlxArray> {
    let (gate, up) = (gate.into(), up.into());
    let m = x2.shape().first().copied().unwrap_or(0);
    let cfg = plan(m, x2.dtype(), true, gate.geometry.out_features());
    // The warp-specialized GEMM decodes once a pass of 128 rows, as the dense path once a call,
    // and multiplies without writing the dense layer: it keeps every row count it is planned at.
    if uses_dense(m, x2.dtype()) && cfg.kernel != AxisOneKernel::Specialized && fuses(gate.geometry, up.geometry) {
        let g = linear(x2, gate.codes, gate.scales, gate.geometry)?;
        let u = linear(x2, up.codes, up.scales, up.geometry)?;
        return g.silu()?.multiply(&u);
    }
    swiglu_with(x2, gate, up, cfg)
}

/// [`swiglu`] with an explicit shape (also the `tuning` feature's `swiglu_with`).
pub(crate) fn swiglu_with(
    x2: &MlxArray,
    gate: LayerOperands<'_>,
    up: LayerOperands<'_>,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    Ok(swiglu_call(x2, gate, up, cfg, 0)?.remove(0))
}

/// [`swiglu`] where its plan takes the fragment kernel or the GEMM (16-bit activations below the
/// dense path, f32 ones up to it), whose launch then also zeroes `counters` fold counters for the
/// down kernel's launch after it (`cuda::down`'s fed calls, which need no pre-pass): the SwiGLU
/// and the zeroed counters. `None` where the plan takes another kernel.
pub(crate) fn swiglu_feeding(
    x2: &MlxArray,
    gate: LayerOperands<'_>,
    up: LayerOperands<'_>,
    counters: usize,
) -> Result<Option<(MlxArray, MlxArray)>> {
    let m = x2.shape().first().copied().unwrap_or(0);
    let cfg = plan(m, x2.dtype(), true, gate.geometry.out_features());
    // The GEMM feeding down takes one launch off a layer at 3–8 rows (the down pre-pass); in
    // Qwen3-14B's MLP chain on an H200 it measured within the runs' spread of the unfed GEMM
    // (docs/cuda-mlp.md).
    let feeds = matches!(cfg.kernel, AxisOneKernel::Fragment | AxisOneKernel::Gemm);
    if uses_dense(m, x2.dtype()) || !feeds || counters == 0 {
        return Ok(None);
    }
    // The count is also the kernel's template int COUNTERS (an i32).
    let Ok(feed) = i32::try_from(counters) else {
        invalid!("CUDA gate·up kernel: {counters} fold counters overflow the launch's sizes");
    };
    let mut outs = swiglu_call(x2, gate, up, cfg, feed.unsigned_abs())?;
    let counters = outs.pop().expect("the SwiGLU and the counters");
    Ok(Some((outs.pop().expect("the SwiGLU and the counters"), counters)))
}

/// One launch of the fused variant by `cfg` (zeroing `feed` counters too where not 0): its
/// outputs.
fn swiglu_call(
    x2: &MlxArray,
    gate: LayerOperands<'_>,
    up: LayerOperands<'_>,
    cfg: AxisOneConfig,
    feed: u32,
) -> Result<Vec<MlxArray>> {
    let (g, ug) = (gate.geometry, up.geometry);
    let what = "CUDA gate·up kernel";
    if !same_but_bits(g, ug) {
        unserved!("{what}: gate {g} and up {ug} differ in more than their bit widths; the fused kernel needs the same rows, inputs, T, L and layout");
    }
    let m = check(what, x2, gate.codes, gate.scales, g)?;
    check(&format!("{what} (up projection)"), x2, up.codes, up.scales, ug)?;
    let prepared = prepared_launch(g, cfg, m, x2.dtype(), Variant::Fused { up_bits: ug.k, feed })?;
    let xs = prepared.kernel_inputs(x2, gate.scales)?;
    let mut inputs: Vec<&MlxArray> = xs.iter().collect();
    inputs.extend([gate.codes, gate.scales, up.codes, up.scales]);
    prepared.kernel.apply_prepared(&inputs, &prepared.launch)
}

/// Checks the call: a served geometry, then the operands (`x2 [M >= 1, in]` in f32/f16/bf16,
/// the codes and scales in `g`'s shapes). Returns `M`.
fn check(what: &str, x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<usize> {
    if !supports(g) {
        unserved!(
            "{what}: unsupported geometry {g} (needs axis 1, row-major codes, T 256, L <= 16, k 2..=4; k 5..8 are untested on this kernel; at most {MAX_CODE_WORDS} code words)"
        );
    }
    check_operands(what, x2, codes, scales, g)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn unserved_geometries_and_bad_activations_are_refused() {
        let down = TrellisGeometry::row_major(512, 256, 3, 256, 12, 0).unwrap();
        let x = MlxArray::zeros(&[2, 512], Dtype::Float32).unwrap();
        let codes = MlxArray::zeros(&down.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[512], Dtype::Float16).unwrap();
        let err = linear(&x, &codes, &scales, &down).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unserved, "{err}");
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let codes = MlxArray::zeros(&up.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[256], Dtype::Float16).unwrap();
        let wide = MlxArray::zeros(&[2, 256], Dtype::Float32).unwrap();
        let err = linear(&wide, &codes, &scales, &up).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("[M >= 1, 512]"), "{err}");
        let ints = MlxArray::zeros(&[2, 512], Dtype::Int32).unwrap();
        assert_eq!(linear(&ints, &codes, &scales, &up).unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
    }

    #[test]
    fn codes_wider_than_the_tested_widths_are_unserved_naming_them() {
        for k in [5, 6, 8] {
            let up = TrellisGeometry::row_major(256, 512, k, 256, 16, 1).unwrap();
            assert!(!supports(&up));
            let x = MlxArray::zeros(&[2, 512], Dtype::Float32).unwrap();
            let codes = MlxArray::zeros(&up.codes_shape(), Dtype::Uint32).unwrap();
            let scales = MlxArray::zeros(&[256], Dtype::Float16).unwrap();
            let err = linear(&x, &codes, &scales, &up).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Unserved, "{err}");
            assert!(err.to_string().contains("k 2..=4; k 5..8 are untested"), "{err}");
        }
    }

    #[test]
    fn matrices_past_32_bit_word_offsets_are_unserved() {
        // 2^17 rows of 2^17 inputs at k 4: 2^34 weights, 2^31 words (served); 2^18 rows: 2^32.
        let served = TrellisGeometry::row_major(1 << 17, 1 << 17, 4, 256, 16, 1).unwrap();
        assert_eq!(served.code_words(), 1 << 31);
        assert!(supports(&served));
        let past = TrellisGeometry::row_major(1 << 18, 1 << 17, 4, 256, 16, 1).unwrap();
        assert_eq!(past.code_words(), 1 << 32);
        assert!(!supports(&past));
    }
}
