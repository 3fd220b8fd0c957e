//! The configuration knobs behind the public entry points (the `tuning` feature), for benchmark
//! sweeps and tests: the down kernel's configurations and plan, a call with an explicit
//! configuration and its partial sums before the fold; the axis-1 kernel's shapes and plan, and
//! its calls with an explicit shape.
//!
//! The configurations and plans are declared where they belong, public with the feature through
//! `crate::tuning_mods!` as Metal's kernel families are (`down::config`, `down::plan`,
//! `gate_up::config`, `gate_up::plan`); this module keeps them, and the calls with an explicit
//! configuration, under the names the benchmarks and tests use.

use crate::array::MlxArray;
use crate::error::Result;
use crate::trellis::format::TrellisGeometry;
use crate::trellis::operands::LayerOperands;
use crate::trellis::rotation::Rotation;

use super::down::OutputRotation;

pub use super::down::config::{CudaDownConfig, StepUnroll};
pub use super::down::config_text::parse_list as parse_down_configs;
pub use super::down::plan::{plan, plan_for};
pub use super::down::ws::CudaDownWsConfig;
pub use super::gate_up::config::{AxisOneConfig, AxisOneKernel, INT8_MAX_ROWS};
pub use super::gate_up::linear_residual_with as axis_one_residual_with;
pub use super::gate_up::plan::{plan as axis_one_plan, split_pass_tiles, GEMM_FUSED_MIN_ROWS, GEMM_MIN_ROWS};

/// [`down_cuda`](super::down::down_cuda) with an explicit configuration and never the dense
/// path (every valid configuration gives the same sums up to f32 rounding order).
pub fn down_cuda_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<MlxArray> {
    Ok(super::down::run(x2, &[(codes, scales)], g, cfg, None, None, &[])?.0.remove(0))
}

/// [`down_residual_cuda`](super::down::down_residual_cuda) with an explicit configuration and
/// never the dense path: `residual + x2 · W`, the add in the kernel's fold.
pub fn down_residual_cuda_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
    residual: &MlxArray,
) -> Result<MlxArray> {
    Ok(super::down::run(x2, &[(codes, scales)], g, cfg, Some(residual), None, &[])?.0.remove(0))
}

/// The down projection on the warp-specialized GEMM (`down_ws.cu`, sm_90a) with an explicit
/// configuration, plus `residual` where given: the output and the kernel's partial sums (scratch
/// of the tiles its blocks share).
pub fn down_ws_cuda_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownWsConfig,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    Ok(super::down::ws::run(x2, codes, scales, g, cfg, residual)?.0)
}

/// The kernel's f32 partial sums `[M, SPLITS, C]` of [`down_cuda_with`]'s call, which it also
/// folds itself (for profiling).
pub fn down_cuda_partials(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<MlxArray> {
    Ok(super::down::run(x2, &[(codes, scales)], g, cfg, None, None, &[])?.1)
}

/// [`down_pair_cuda`](super::down::down_pair_cuda) with an explicit configuration and never the
/// dense path: one launch of the pair variant for two matrices of one geometry.
pub fn down_pair_cuda_with(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<[MlxArray; 2]> {
    super::down::run_pair(x2, codes, scales, g, cfg)
}

/// A layer coded along its rotated outputs with an explicit configuration and never the dense
/// path: the logical output `(x2 · W)[:, :n] · Qᵀ` of `rotation` (of `n` entries), plus
/// `residual` (`[M, n]`) where given, from one launch whose fold rotates; an error where the
/// configuration's tiles do not hold whole rotation blocks.
pub fn down_rotated_cuda_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
    rotation: &Rotation,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    let signs = signs_on_device(rotation)?;
    let r = [output_rotation(&signs, rotation)];
    Ok(super::down::run(x2, &[(codes, scales)], g, cfg, residual, None, &r)?.0.remove(0))
}

/// [`down_rotated_cuda_with`] for two matrices of one geometry on the same activations, each
/// with its rotation (of one width and block): one launch of the pair variant.
pub fn down_pair_rotated_cuda_with(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
    rotations: [&Rotation; 2],
) -> Result<[MlxArray; 2]> {
    let signs = [signs_on_device(rotations[0])?, signs_on_device(rotations[1])?];
    let rs = [output_rotation(&signs[0], rotations[0]), output_rotation(&signs[1], rotations[1])];
    let (ys, _) = super::down::run(x2, &[(codes[0], scales[0]), (codes[1], scales[1])], g, cfg, None, None, &rs)?;
    Ok(ys.try_into().expect("the pair variant has two outputs"))
}

/// A rotation's signs as the kernels take them: f32 `[n]` on the device.
fn signs_on_device(rotation: &Rotation) -> Result<MlxArray> {
    MlxArray::from_slice(rotation.signs(), &[rotation.len()])
}

/// `rotation`, its signs on the device, as the down kernel's fold takes it.
fn output_rotation<'a>(signs: &'a MlxArray, rotation: &Rotation) -> OutputRotation<'a> {
    OutputRotation { signs, logical: rotation.len(), block: rotation.block() }
}

/// [`linear`](super::gate_up::linear) with an explicit shape and never the dense path.
pub fn axis_one_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    super::gate_up::linear_with(x2, codes, scales, g, cfg)
}

/// [`swiglu`](super::gate_up::swiglu) with an explicit shape and never the dense path.
pub fn swiglu_with<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    super::gate_up::swiglu_with(x2, gate.into(), up.into(), cfg)
}
