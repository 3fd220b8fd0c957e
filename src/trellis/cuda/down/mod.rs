//! Down projections on MLX's CUDA back-end: `kernels/cuda/down_mma.cu`, registered through
//! `mlx_fast_cuda_kernel` and applied with the template ints of a `CudaDownConfig`. The kernel
//! writes f32 partial sums `[M, SPLITS, C]` (split-K over the input rows) and folds them in the
//! same launch: the last thread block of each column tile to finish adds the tile's partials in
//! split order and writes the output in the activation dtype.
//!
//! The kernel decodes code values straight into tensor-core fragments (exact f16 integers) and
//! multiplies them with `mma.sync` against the activations times the row scales; see the kernel
//! file for the work split. With prescaled B tiles a pre-pass kernel
//! (`kernels/cuda/prescale.cu`) first writes the activations times the row scales as f16 (and
//! zeroes the fold's counters), and the kernel streams them in with the codes. The plan
//! (`plan.rs`) picks the configuration for a row count; `launch.rs` registers the kernel and
//! prepares each call's launch once.
//!
//! From [`DENSE_MIN_ROWS`] rows of 16-bit activations [`down_cuda`] instead decodes the layer
//! once to dense weights and runs MLX's matmul (`down_cuda_dense`): the decode costs one write
//! of the dense layer whatever the row count, and MLX's matmul then runs at the dense speed,
//! while the fused kernel's decode-and-multiply grows with the rows.
//!
//! A fed call (`fed_counters`, `down_fed`) takes its fold counters zeroed from the launch
//! before it (the fused gate·up·SwiGLU's, `cuda::gate_up`) and finds each row's power of two in
//! its own thread blocks, over their split of the inputs (`BLOCK_EXP`): one launch a call, no
//! pre-pass. An MLP's gate·up and down at up to 8 rows run so.
//!
//! [`down_residual_cuda`] adds a residual stream in the fold (`residual + x · W`, rounded once):
//! a model's down projection and its residual add in one launch.
//!
//! `down_rotated_cuda` and `down_pair_rotated_cuda` (what `TrellisLinear` calls on CUDA) serve a
//! layer coded along its rotated outputs (docs/format.md §10): the kernel's fold turns the
//! outputs back, `y[:, :n] · Qᵀ`, where `rotate.cu` would be one more launch after it.
//!
//! [`down_pair_cuda`] runs two matrices of one geometry on the same activations (an MLP's gate
//! and up stored along their outputs) as one launch of the kernel's pair variant after one
//! pre-pass: at one row a layer's call is bound by fixed launch and host costs, not by its
//! decode, so two calls cost about twice one and the pair about one (docs/cuda-down.md).

// The configuration and the plan (public with the `tuning` feature, for the sweeps and tests that
// call the kernel with a configuration of their own; crate-private otherwise), as Metal's families.
crate::tuning_mods! {
    config;
    plan;
}
pub(crate) mod config_text;
mod launch;

/// The warp-specialized decode-once GEMM (`down_ws.cu`): not in the plan yet, whose layers it
/// runs level with the fragment kernel (docs/cuda-down.md §7); with `tuning`, for the tests and
/// the measurements that may put it there.
#[cfg(feature = "tuning")]
pub mod ws;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::trellis::checks::{check_operands, check_residual};
use crate::trellis::format::TrellisGeometry;

use super::expand::down_cuda_dense;
use super::prescale;
use super::rotate::{rotate_with_signs, Direction};
use config::CudaDownConfig;
use launch::{prepared_launch, FoldRotation, Variant};
use plan::{plan_for, require_supported};
pub use plan::{supports, uses_dense, DENSE_MIN_ROWS};

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype: the fused kernel with the configuration the
/// plan picks (`plan.rs`), or from [`DENSE_MIN_ROWS`] rows of 16-bit activations [`down_cuda_dense`].
///
/// `codes` must start on a 16-byte boundary: the kernel streams it with 16-byte asynchronous
/// copies. Arrays MLX allocates (loaded, created or computed, and so every `TrellisLinear`'s)
/// do; a view that starts inside another array's buffer may not, and must be copied first
/// ([`MlxArray::deep_copy`]). Activations and scales may be such views: the kernel checks their
/// alignment and loads them one at a time when they are not aligned.
pub fn down_cuda(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    require_supported(g)?;
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) {
        return down_cuda_dense(x2, codes, scales, g);
    }
    Ok(run(x2, &[(codes, scales)], g, plan_for(g, m, x2.dtype()), None, None, &[])?.0.remove(0))
}

/// A layer's output rotation, as the kernel's fold or `rotate.cu` applies it to the stored
/// outputs of a layer coded along its rotated outputs (docs/format.md §10.1): `y[:, :logical] ·
/// Qᵀ` with `Q = diag(signs) · blockdiag(H_block / √block)`.
#[derive(Clone, Copy)]
pub(crate) struct OutputRotation<'a> {
    /// The signs on the device, f32 `[logical]`.
    pub(crate) signs: &'a MlxArray,
    /// The logical output columns: the first of the stored ones, a multiple of `block`.
    pub(crate) logical: usize,
    /// The rotation's block (a power of two).
    pub(crate) block: usize,
}

impl OutputRotation<'_> {
    /// The shape the fold takes.
    fn in_fold(&self) -> FoldRotation {
        FoldRotation { logical: self.logical, block: self.block }
    }

    /// `rotate.cu` on stored outputs `y` (`[M, stored]`): the logical ones.
    fn apply(&self, y: &MlxArray, stored: usize) -> Result<MlxArray> {
        rotate_with_signs(y, self.signs, self.logical, self.block, Direction::Inverse { stored })
    }
}

/// The logical output `(x2 [M, in] · W)[:, :logical] · Qᵀ -> [M, logical]` of a layer coded
/// along its rotated outputs, in `x2`'s dtype; with `residual` (`[M, logical]` in `x2`'s dtype)
/// `residual +` that. Where the plan's configuration can
/// ([`CudaDownConfig::rotates_in_fold`]: tiles of whole rotation blocks, its shared memory within
/// 48 KB), the kernel's fold rotates (one launch: the bits of [`down_cuda`] then `rotate.cu`, the residual added in
/// f32 before the one rounding after the rotation); otherwise, and from [`DENSE_MIN_ROWS`] rows
/// of 16-bit activations, [`down_cuda`], then `rotate.cu` and MLX's add. The rules for `codes`'
/// alignment are [`down_cuda`]'s.
pub(crate) fn down_rotated_cuda(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    rotation: OutputRotation<'_>,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    require_supported(g)?;
    let m = x2.shape().first().copied().unwrap_or(0);
    let cfg = plan_for(g, m, x2.dtype());
    if !uses_dense(m, x2.dtype()) && cfg.rotates_in_fold(g, rotation.block, x2.dtype()) {
        return Ok(run(x2, &[(codes, scales)], g, cfg, residual, None, &[rotation])?.0.remove(0));
    }
    if let Some(r) = residual {
        check_residual("CUDA down kernel with a residual", x2, r, m, rotation.logical)?;
    }
    let y = rotation.apply(&down_cuda(x2, codes, scales, g)?, g.cols)?;
    match residual {
        Some(r) => r.add(&y),
        None => Ok(y),
    }
}

/// [`down_pair_cuda`] of two layers coded along their rotated outputs (of one geometry and one
/// logical width and rotation block): the two logical outputs, as [`down_rotated_cuda`] gives
/// each, from one launch of the pair variant where its fold can rotate (as there), else the pair's
/// stored outputs turned back by `rotate.cu` each.
pub(crate) fn down_pair_rotated_cuda(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
    rotations: [OutputRotation<'_>; 2],
) -> Result<[MlxArray; 2]> {
    require_supported(g)?;
    if rotations[0].in_fold() != rotations[1].in_fold() {
        invalid!(
            "CUDA down kernel: a pair's rotations must share their width and block ({:?} and {:?})",
            rotations[0].in_fold(),
            rotations[1].in_fold()
        );
    }
    let m = x2.shape().first().copied().unwrap_or(0);
    let cfg = plan_for(g, m, x2.dtype());
    if !uses_dense(m, x2.dtype()) && cfg.rotates_in_fold(g, rotations[0].block, x2.dtype()) {
        let mats = [(codes[0], scales[0]), (codes[1], scales[1])];
        let (ys, _) = run(x2, &mats, g, cfg, None, None, &rotations)?;
        return Ok(ys.try_into().expect("the pair variant has two outputs"));
    }
    let [a, b] = down_pair_cuda(x2, codes, scales, g)?;
    Ok([rotations[0].apply(&a, g.cols)?, rotations[1].apply(&b, g.cols)?])
}

/// Fold counters a fed call of `m` rows of `dtype` activations needs zeroed (one per column tile
/// and pass of its plan), or `None` where it does not run fed: a geometry the kernel does not
/// serve, or more than [`FED_MAX_ROWS`] rows.
pub(crate) fn fed_counters(g: &TrellisGeometry, m: usize, dtype: Dtype) -> Option<usize> {
    fed_counters_for(g, m, dtype, false, None)
}

/// [`fed_counters`] of a call of one matrix or (`pair`) of the pair variant, whose fold turns
/// the outputs back where `rotation_block` is given (rotation blocks of that many outputs):
/// `None` where the call does not run fed, or its fold cannot rotate
/// ([`CudaDownConfig::rotates_in_fold`]).
pub(crate) fn fed_counters_for(
    g: &TrellisGeometry,
    m: usize,
    dtype: Dtype,
    pair: bool,
    rotation_block: Option<usize>,
) -> Option<usize> {
    fed_plan(g, m, dtype, pair)
        .filter(|(cfg, _)| rotation_block.is_none_or(|block| cfg.rotates_in_fold(g, block, dtype)))
        .map(|(_, counters)| counters)
}

/// The plan of a fed call and its fold counters ([`fed_counters_for`]; the pair's tiles are
/// twice one matrix's).
fn fed_plan(g: &TrellisGeometry, m: usize, dtype: Dtype, pair: bool) -> Option<(CudaDownConfig, usize)> {
    if !supports(g) || !(1..=FED_MAX_ROWS).contains(&m) || uses_dense(m, dtype) {
        return None;
    }
    let cfg = plan_for(g, m, dtype);
    let mats = if pair { 2 } else { 1 };
    (!cfg.prescaled && cfg.mt == 1).then(|| (cfg, mats * cfg.column_blocks(g) * m.div_ceil(8 * cfg.mt as usize)))
}

/// The most activation rows a fed call takes: one 8-row tile a pass, whose blocks find the rows'
/// powers of two before their main loop (from 9 rows the plan's shapes were measured with the
/// pre-pass, which for 16-bit activations also converts them).
pub(crate) const FED_MAX_ROWS: usize = 8;

/// [`down_cuda`] (or with `residual`, [`down_residual_cuda`]) on `counters`, the fold counters
/// zeroed by the launch before it ([`fed_counters`] of them): the kernel alone, each block
/// finding its rows' powers of two over its split. For the fused gate·up·SwiGLU's output.
pub(crate) fn down_fed(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    counters: &MlxArray,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    Ok(run_fed(x2, &[(codes, scales)], g, residual, &[], counters)?.remove(0))
}

/// [`down_rotated_cuda`] on `counters`, zeroed by a launch before it ([`fed_counters_for`] of
/// them): one launch, whose blocks find their rows' powers of two and whose fold turns the outputs
/// back (and adds `residual` where given). An error where the call does not run so.
pub(crate) fn down_rotated_fed(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    rotation: OutputRotation<'_>,
    residual: Option<&MlxArray>,
    counters: &MlxArray,
) -> Result<MlxArray> {
    Ok(run_fed(x2, &[(codes, scales)], g, residual, &[rotation], counters)?.remove(0))
}

/// [`down_pair_cuda`] (with `rotations`, [`down_pair_rotated_cuda`]) on `counters`, zeroed by a
/// launch before it ([`fed_counters_for`] of them): one launch of the pair variant and no
/// pre-pass. Each output has the bits the fed call of its matrix alone gives (each matrix's blocks
/// find the exponents of the activations times its own scales). An error where the call does not
/// run so.
pub(crate) fn down_pair_fed(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
    rotations: Option<[OutputRotation<'_>; 2]>,
    counters: &MlxArray,
) -> Result<[MlxArray; 2]> {
    let mats = [(codes[0], scales[0]), (codes[1], scales[1])];
    let ys = run_fed(x2, &mats, g, None, rotations.as_ref().map_or(&[], |r| &r[..]), counters)?;
    Ok(ys.try_into().expect("the pair variant has two outputs"))
}

/// One fed launch of `mats` (one matrix or a pair) on `counters`: the plan's configuration where
/// the call runs fed with these rotations and `counters` has the count it takes.
fn run_fed(
    x2: &MlxArray,
    mats: &[(&MlxArray, &MlxArray)],
    g: &TrellisGeometry,
    residual: Option<&MlxArray>,
    rotations: &[OutputRotation<'_>],
    counters: &MlxArray,
) -> Result<Vec<MlxArray>> {
    require_supported(g)?;
    let (m, dtype, pair) = (x2.shape().first().copied().unwrap_or(0), x2.dtype(), mats.len() == 2);
    let block = rotations.first().map(|r| r.block);
    let plan = fed_plan(g, m, dtype, pair).filter(|&(cfg, want)| {
        want == counters.size() && block.is_none_or(|block| cfg.rotates_in_fold(g, block, dtype))
    });
    let Some((cfg, _)) = plan else {
        invalid!(
            "CUDA down kernel: {} fed counters do not fit {m} rows of {dtype} activations of {g} ({}{})",
            counters.size(),
            if pair { "a pair" } else { "one matrix" },
            block.map_or(String::new(), |b| format!(", outputs turned back in blocks of {b}"))
        );
    };
    Ok(run(x2, mats, g, cfg, residual, Some(counters), rotations)?.0)
}

/// `residual + x2 [M, in] · W -> [M, out]` in `x2`'s dtype: [`down_cuda`] with the add in the
/// kernel's fold, in f32 before the output's one rounding (where [`down_cuda`] and an add round
/// twice), so that a model's residual add is no launch of its own. `residual` is `[M, out]` in
/// `x2`'s dtype. From [`DENSE_MIN_ROWS`] rows of 16-bit activations: the dense path, then MLX's
/// add. The rules for `codes`' alignment are [`down_cuda`]'s.
pub fn down_residual_cuda(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
) -> Result<MlxArray> {
    require_supported(g)?;
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) {
        check_down_residual(x2, g, residual)?;
        return residual.add(&down_cuda_dense(x2, codes, scales, g)?);
    }
    Ok(run(x2, &[(codes, scales)], g, plan_for(g, m, x2.dtype()), Some(residual), None, &[])?.0.remove(0))
}

/// The residual's checks: `[M, out]` in `x2`'s dtype (`x2` `[M, in]`).
fn check_down_residual(x2: &MlxArray, g: &TrellisGeometry, residual: &MlxArray) -> Result<()> {
    let m = x2.shape().first().copied().unwrap_or(0);
    check_residual("CUDA down kernel with a residual", x2, residual, m, g.cols)
}

/// `x2 [M, in]` times two matrices of one geometry, `[x2 · A, x2 · B]` (an MLP's gate and up
/// stored along their outputs), in `x2`'s dtype: one launch of the pair variant and one
/// pre-pass for both where [`down_cuda`] would run its kernel, two calls of [`down_cuda_dense`]
/// from [`DENSE_MIN_ROWS`] rows of 16-bit activations. Each output has the bits [`down_cuda`]
/// gives for its matrix alone. `codes` and `scales` are the two matrices' (`A`'s first); the
/// rules for their alignment are [`down_cuda`]'s.
pub fn down_pair_cuda(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
) -> Result<[MlxArray; 2]> {
    require_supported(g)?;
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) {
        return Ok([down_cuda_dense(x2, codes[0], scales[0], g)?, down_cuda_dense(x2, codes[1], scales[1], g)?]);
    }
    run_pair(x2, codes, scales, g, plan_for(g, m, x2.dtype()))
}

/// One launch of the pair variant with `cfg` (after its pre-pass): the two outputs.
pub(crate) fn run_pair(
    x2: &MlxArray,
    codes: [&MlxArray; 2],
    scales: [&MlxArray; 2],
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<[MlxArray; 2]> {
    let (ys, _) = run(x2, &[(codes[0], scales[0]), (codes[1], scales[1])], g, cfg, None, None, &[])?;
    Ok(ys.try_into().expect("the pair variant has two outputs"))
}

/// One call of one matrix (plus `residual`, added in the fold, where given) or (two `mats`) of
/// the pair variant: the pre-pass, then the kernel; or with `fed` (the fold counters, zeroed by
/// the launch before) the kernel alone, finding the rows' powers of two itself. With
/// `rotations` (none, or one per matrix of one width and block) the fold turns the outputs back
/// and they are the logical ones. Returns an output per matrix and the partial sums they were
/// folded from (the `tuning` feature's calls with a configuration).
pub(crate) fn run(
    x2: &MlxArray,
    mats: &[(&MlxArray, &MlxArray)],
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
    residual: Option<&MlxArray>,
    fed: Option<&MlxArray>,
    rotations: &[OutputRotation<'_>],
) -> Result<(Vec<MlxArray>, MlxArray)> {
    require_supported(g)?;
    if !matches!(mats.len(), 1 | 2) {
        invalid!("CUDA down kernel: one launch runs one matrix or a pair, not {}", mats.len());
    }
    let pair = mats.len() == 2;
    if pair && residual.is_some() {
        invalid!("CUDA down kernel: the pair variant takes no residual");
    }
    let rotation = match rotations {
        [] => None,
        [first, rest @ ..] if rotations.len() == mats.len() && rest.iter().all(|r| r.in_fold() == first.in_fold()) => {
            Some(first.in_fold())
        }
        _ => invalid!(
            "CUDA down kernel: {} rotations for {} matrices (one each, of one width and block)",
            rotations.len(),
            mats.len()
        ),
    };
    let variant = Variant { pair, residual: residual.is_some(), rotation };
    let out_cols = rotation.map_or(g.cols, |r| r.logical);
    let mut m = 0;
    for (codes, scales) in mats {
        m = check_operands("CUDA down kernel", x2, codes, scales, g)?;
    }
    if let Some(r) = residual {
        check_residual("CUDA down kernel with a residual", x2, r, m, out_cols)?;
    }
    for r in rotations {
        if r.signs.dtype() != Dtype::Float32 || r.signs.shape() != [r.logical] {
            invalid!(
                "CUDA down kernel: rotation signs {:?} {}, expected f32 [{}]",
                r.signs.shape(),
                r.signs.dtype(),
                r.logical
            );
        }
    }
    if fed.is_some() && cfg.prescaled {
        invalid!("CUDA down kernel: a fed call runs on activations as they are (not prescaled)");
    }
    let prepared = prepared_launch(g, cfg, m, x2.dtype(), variant, fed.is_some())?;
    // The pre-pass gives the rows' exponents and the fold counters, a fresh zeroed array per
    // call (two calls in flight never count into the same one), and in prescaled
    // configurations the converted activations the kernel reads in place of x2. A fed call's
    // counters are the launch before's (as fresh), and its blocks find the exponents: the
    // scales stand in for x_exp, which it does not read.
    let (x_scaled, counters, x_exp) = match fed {
        Some(counters) => (None, counters.clone(), mats[0].1.clone()),
        None => {
            let mut pre_inputs = vec![x2];
            pre_inputs.extend(mats.iter().map(|(_, scales)| *scales));
            // x_sum: none asked for.
            let out = prescale::run(pair, &pre_inputs, &prepared.pre_pass, "CUDA down kernel")?;
            (Some(out.x_scaled), out.counters, out.x_exp)
        }
    };
    let b = match &x_scaled {
        Some(x_scaled) if cfg.prescaled => x_scaled,
        _ => x2,
    };
    let mut inputs = vec![b, mats[0].0, mats[0].1, &counters, &x_exp];
    if let Some((codes, scales)) = mats.get(1) {
        inputs.extend([*codes, *scales]);
    }
    inputs.extend(residual);
    inputs.extend(rotations.iter().map(|r| r.signs));
    let mut ys = prepared.kernel.apply_prepared(&inputs, &prepared.launch)?;
    let partials = ys.pop().expect("an output and the partials");
    Ok((ys, partials))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_calls_take_up_to_eight_rows_with_a_counter_per_column_tile() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap().interleaved().unwrap();
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for m in 1..=200 {
                let cfg = plan_for(&qwen, m, dtype);
                let want = (m <= FED_MAX_ROWS).then(|| cfg.column_blocks(&qwen));
                assert_eq!(fed_counters(&qwen, m, dtype), want, "M {m} {dtype}");
                // What a fed call runs: one 8-row tile a pass, activations as they are.
                if want.is_some() {
                    assert!(cfg.mt == 1 && !cfg.prescaled, "M {m} {dtype}: {cfg:?}");
                }
            }
            assert_eq!(fed_counters(&qwen, 0, dtype), None);
        }
        // The one-row plan: 10 column tiles of 512 positions.
        assert_eq!(fed_counters(&qwen, 1, Dtype::Bfloat16), Some(10));
        // A layer the kernel does not serve has none.
        let ragged = TrellisGeometry { cols: 1000, ..qwen };
        assert_eq!(fed_counters(&ragged, 1, Dtype::Bfloat16), None);
    }

    #[test]
    fn the_plan_rotates_smollm2s_attention_in_the_fold_up_to_32_rows() {
        // q and o (576 -> 576) and k and v (576 -> 192) in blocks of 192, rotated in blocks of
        // 64: the fold rotates at 1-32 rows in every dtype (its staging keeps the kernel within
        // 48 KB of shared memory), not where the plan's ring leaves no room.
        let smol = [576, 192].map(|cols| TrellisGeometry::row_major(576, cols, 3, 192, 12, 0).unwrap());
        for g in smol {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=32 {
                    let cfg = plan_for(&g, m, dtype);
                    assert!(cfg.rotates_in_fold(&g, 64, dtype), "{g} M {m} {dtype}: {cfg:?}");
                }
                // 40 rows of f32 take a ring of 44.5 KB: the fold's 4 KB would pass 48 KB.
                let wide = plan_for(&g, 40, Dtype::Float32);
                assert!(!wide.rotates_in_fold(&g, 64, Dtype::Float32), "{g}: {wide:?}");
            }
        }
        // Qwen's down shape (5120 outputs: rotation blocks of 256) at one row.
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap().interleaved().unwrap();
        assert!(plan_for(&qwen, 1, Dtype::Bfloat16).rotates_in_fold(&qwen, 256, Dtype::Bfloat16));
        // A tile of 128 positions holds half of a 256-wide rotation block.
        let narrow = CudaDownConfig { nc: 2, warps: 4, ..Default::default() };
        assert!(
            !narrow.rotates_in_fold(&qwen, 256, Dtype::Bfloat16) && narrow.rotates_in_fold(&qwen, 128, Dtype::Bfloat16)
        );
    }

    #[test]
    fn the_plan_feeds_smollm2s_attention_up_to_8_rows() {
        // q and o (576 -> 576) alone, k and v (576 -> 192) as a pair, rotated back in blocks of 64
        // in the fold: fed at 1-8 rows in every dtype, with a counter per column tile of each
        // matrix; from 9 rows not.
        let smol = [576, 192].map(|cols| TrellisGeometry::row_major(576, cols, 3, 192, 12, 0).unwrap());
        for (g, pair) in [(smol[0], false), (smol[1], true)] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=FED_MAX_ROWS {
                    let cfg = plan_for(&g, m, dtype);
                    let mats = if pair { 2 } else { 1 };
                    let want = mats * cfg.column_blocks(&g);
                    assert_eq!(fed_counters_for(&g, m, dtype, pair, Some(64)), Some(want), "{g} M {m} {dtype}");
                    assert_eq!(fed_counters_for(&g, m, dtype, pair, None), Some(want), "{g} M {m} {dtype}");
                }
                assert_eq!(fed_counters_for(&g, 9, dtype, pair, Some(64)), None, "{g} {dtype}");
            }
        }
        // A rotation block the plan's tiles do not hold whole: not fed with it.
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap().interleaved().unwrap();
        let cfg = plan_for(&qwen, 1, Dtype::Bfloat16);
        let too_wide = 2 * cfg.tile_positions();
        assert_eq!(fed_counters_for(&qwen, 1, Dtype::Bfloat16, false, Some(too_wide)), None);
    }

    #[test]
    fn fed_pairs_and_rotations_of_another_count_are_refused_before_anything_runs() {
        let g = TrellisGeometry::row_major(576, 192, 3, 192, 12, 0).unwrap();
        let x = MlxArray::zeros(&[1, 576], Dtype::Bfloat16).unwrap();
        let codes = MlxArray::zeros(&g.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[576], Dtype::Float16).unwrap();
        let signs = MlxArray::ones(&[192], Dtype::Float32).unwrap();
        let rotation = OutputRotation { signs: &signs, logical: 192, block: 64 };
        let single = fed_counters_for(&g, 1, Dtype::Bfloat16, false, Some(64)).unwrap();
        let pair = fed_counters_for(&g, 1, Dtype::Bfloat16, true, Some(64)).unwrap();
        assert_eq!(pair, 2 * single);
        // The pair given one matrix's counters, the single call the pair's.
        let counters = MlxArray::zeros(&[single], Dtype::Uint32).unwrap();
        let err = down_pair_fed(&x, [&codes, &codes], [&scales, &scales], &g, Some([rotation, rotation]), &counters)
            .expect_err("too few counters");
        assert!(err.to_string().contains(&format!("{single} fed counters do not fit 1 rows")), "{err}");
        assert!(err.to_string().contains("a pair, outputs turned back in blocks of 64"), "{err}");
        let counters = MlxArray::zeros(&[pair], Dtype::Uint32).unwrap();
        let err = down_rotated_fed(&x, &codes, &scales, &g, rotation, None, &counters).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("one matrix, outputs turned back"), "{err}");
    }

    #[test]
    fn fed_counters_of_another_count_are_refused_before_anything_runs() {
        let g = TrellisGeometry::row_major(512, 1024, 3, 256, 12, 0).unwrap();
        let x = MlxArray::zeros(&[2, 512], Dtype::Bfloat16).unwrap();
        let codes = MlxArray::zeros(&g.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[512], Dtype::Float16).unwrap();
        let want = fed_counters(&g, 2, Dtype::Bfloat16).unwrap();
        let counters = MlxArray::zeros(&[want + 1], Dtype::Uint32).unwrap();
        let err = down_fed(&x, &codes, &scales, &g, &counters, None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains(&format!("{} fed counters do not fit 2 rows", want + 1)), "{err}");
    }
}
