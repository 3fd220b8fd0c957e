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
//! (`plan.rs`) picks the configuration for a row count.
//!
//! From [`DENSE_MIN_ROWS`] rows of 16-bit activations [`down_cuda`] instead decodes the layer
//! once to dense weights and runs MLX's matmul (`down_cuda_dense`): the decode costs one write
//! of the dense layer whatever the row count, and MLX's matmul then runs at the dense speed,
//! while the fused kernel's decode-and-multiply grows with the rows.

// The configuration and the plan (public with the `tuning` feature, for the sweeps and tests that
// call the kernel with a configuration of their own; crate-private otherwise), as Metal's families.
crate::tuning_mods! {
    config;
    plan;
}

use std::sync::Arc;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::{check_operands, int};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

use super::expand::down_cuda_dense;
use super::prescale::{self, PrePassOutput};
use config::CudaDownConfig;
use plan::{plan_for, require_supported};
pub use plan::{supports, uses_dense, DENSE_MIN_ROWS};

const SOURCE: &str = sources::CUDA_DOWN_MMA;
const HEADER: &str = sources::CUDA_DOWN_MMA_HEADER;

/// Prescaled rows are padded to a multiple of this (whole steps of any `ks`; see prescale.cu).
const PRESCALED_ROW_MULTIPLE: usize = 64;

/// The kernel registered with `shared_memory` bytes of dynamic shared memory, one per size (MLX
/// takes the size when a kernel is registered; it is a function of the template arguments, so
/// each compiled instantiation always launches with the same size).
fn kernel(shared_memory: usize) -> Result<&'static CudaKernel> {
    let key = KernelKey { family: "down_mma", variant: "", shared_memory };
    registry::cuda(key, || {
        Ok(KernelText {
            inputs: &["x", "codes", "scales", "counters", "x_exp"],
            outputs: &["y", "partial"],
            body: SOURCE.to_string(),
            header: [sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT, HEADER].join("\n"),
        })
    })
}

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
    Ok(run(x2, codes, scales, g, plan_for(g, m, x2.dtype()))?.0)
}

/// One call: the pre-pass where the configuration has one, then the kernel. Returns the output
/// and the partials it was folded from (the `tuning` feature's calls with a configuration).
pub(crate) fn run(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
) -> Result<(MlxArray, MlxArray)> {
    require_supported(g)?;
    let m = check_operands("CUDA down kernel", x2, codes, scales, g)?;
    let prepared = prepared_launch(g, cfg, m, x2.dtype())?;
    // The pre-pass gives the rows' exponents and the fold counters, a fresh zeroed array per
    // call (two calls in flight never count into the same one), and in prescaled
    // configurations the converted activations the kernel reads in place of x2.
    let mut outs = prescale::kernel()?
        .apply_prepared(&[x2, scales], &prepared.pre_pass)
        .context("CUDA down kernel: the activations' pre-pass")?;
    let x_exp = outs.pop().expect("three outputs");
    let counters = outs.pop().expect("three outputs");
    let x_scaled = outs.pop().expect("three outputs");
    let b = if cfg.prescaled { &x_scaled } else { x2 };
    let inputs = [b, codes, scales, &counters, &x_exp];
    let mut outs = prepared.kernel.apply_prepared(&inputs, &prepared.launch)?;
    let partials = outs.pop().expect("two outputs");
    Ok((outs.pop().expect("two outputs"), partials))
}

/// One call's launches, prepared once (see [`prepared_launch`]): the down kernel and the
/// pre-pass before it (`prescale.cu`: the rows' exponents, the zeroed fold counters and, for
/// prescaled configurations, the converted activations).
struct PreparedDown {
    kernel: &'static CudaKernel,
    launch: CudaLaunch,
    pre_pass: CudaLaunch,
}

/// The kernel and its launch for `m` rows of `dtype` activations, checked and converted once
/// per geometry, configuration, row count and dtype: a model makes the same few calls many
/// times, and building the template arguments at every call costs host time.
fn prepared_launch(g: &TrellisGeometry, cfg: CudaDownConfig, m: usize, dtype: Dtype) -> Result<Arc<PreparedDown>> {
    static LAUNCHES: LaunchCache<(TrellisGeometry, CudaDownConfig, usize, Dtype), PreparedDown> =
        LaunchCache::new(1024);
    LAUNCHES.get_or_build((*g, cfg, m, dtype), || prepare(g, cfg, m, dtype))
}

/// [`prepared_launch`]'s work on a miss.
fn prepare(g: &TrellisGeometry, cfg: CudaDownConfig, m: usize, dtype: Dtype) -> Result<PreparedDown> {
    cfg.check(g, dtype)?;
    // Prescaled activations: [sets * m, row_pad] f16 (the f32 residues are the second set).
    let row_pad = g.rows.next_multiple_of(PRESCALED_ROW_MULTIPLE);
    let sets = if dtype == Dtype::Float32 { 2 } else { 1 };
    // The kernel indexes them with 32-bit offsets, and the pre-pass runs one grid row per
    // activation row (CUDA's grid y is at most 65535).
    if cfg.prescaled && (sets * m * row_pad > i32::MAX as usize || m > 65535) {
        invalid!("CUDA down kernel: {m} rows of {dtype} activations of {g} are too many for prescaled B tiles (at most 65535 rows and 2^31 - 1 f16 values; {sets} x {m} x {row_pad} here)");
    }
    let passes = m.div_ceil(8 * cfg.mt as usize);
    let ctas = cfg.column_blocks(g);
    // Grid y holds the column tiles, z the splits of every pass (CUDA's y and z are at most 65535).
    let grid_z = cfg.splits as usize * passes;
    if ctas > 65535 || grid_z > 65535 {
        invalid!("CUDA down kernel: {m} rows of {g} are too many for one launch grid ({ctas} column tiles by {} splits x {passes} passes; at most 65535 each)", cfg.splits);
    }
    let kernel = kernel(cfg.shared_bytes(g, dtype == Dtype::Float32))?;
    let threads = 32 * cfg.warps as usize;
    let counters = ctas * passes;
    let launch = LaunchConfig::new([threads, ctas, grid_z], [threads, 1, 1])
        .output(&[m, g.cols], dtype)
        .output(&[m, cfg.splits as usize, g.cols], Dtype::Float32)
        .template_dtype("Y", dtype)
        // Prescaled activations are f16 whatever the call's dtype.
        .template_dtype("T", if cfg.prescaled { Dtype::Float16 } else { dtype })
        .template_int("R", int("CUDA down kernel", g.rows)?)
        .template_int("C", int("CUDA down kernel", g.cols)?)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("NC", cfg.nc as i32)
        .template_int("MT", cfg.mt as i32)
        .template_int("KS", cfg.ks as i32)
        .template_int("WARPS", cfg.warps as i32)
        .template_int("SPLITS", cfg.splits as i32)
        .template_int("STAGES", cfg.stages as i32)
        .template_bool("INTERLEAVE", g.layout() == CodeLayout::K3Interleaved)
        .template_bool("SPLIT_X", dtype == Dtype::Float32)
        .template_bool("BIAS_FOLD", cfg.bias_fold && dtype != Dtype::Float32)
        .template_bool("PACK_FMA", cfg.pack_fma && dtype != Dtype::Float32)
        .template_bool("PRESCALED", cfg.prescaled)
        .template_bool("MBARRIERS", cfg.mbarriers);
    let launch = kernel.prepare(&launch)?;
    let output = if cfg.prescaled { PrePassOutput::Activations } else { PrePassOutput::ExponentsOnly };
    let pre_pass = prescale::prepare(m, g.rows, row_pad, dtype, counters, true, output)?;
    Ok(PreparedDown { kernel, launch, pre_pass })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_source_is_compacted() {
        // Text outside the compactor's plain subset would go as written.
        for (text, file) in
            [(SOURCE, "down_mma.cu"), (HEADER, "down_mma.cuh"), (sources::CUDA_FRAGMENT, "fragment.cuh")]
        {
            let compact = crate::kernel::compact::compact_plain_cpp(text).unwrap_or_else(|| panic!("{file}"));
            assert!(compact.len() < text.len(), "{file}");
        }
    }

    #[test]
    fn too_many_rows_for_prescaled_b_tiles_is_an_error_that_says_so() {
        // Caught while the launch is prepared, before anything runs (so on every back-end).
        let g = TrellisGeometry::row_major(16, 256, 2, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 2, mt: 8, ks: 1, warps: 8, splits: 1, prescaled: true, ..Default::default() };
        cfg.check(&g, Dtype::Float32).unwrap();
        let err = prepared_launch(&g, cfg, 65536, Dtype::Float32).err().expect("65536 rows").to_string();
        assert!(err.contains("too many for prescaled B tiles") && err.contains("65536 rows"), "{err}");
    }

    #[test]
    fn a_grid_past_cudas_limits_is_an_error_that_says_so() {
        let g = TrellisGeometry::row_major(16, 256, 2, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 2, mt: 1, ks: 1, warps: 8, splits: 1, ..Default::default() };
        cfg.check(&g, Dtype::Float32).unwrap();
        // 8 rows a pass, one split: 65536 passes are one more than grid z holds.
        let err = prepared_launch(&g, cfg, 8 * 65536, Dtype::Float32).err().expect("65536 passes").to_string();
        assert!(err.contains("too many for one launch grid") && err.contains("65536 passes"), "{err}");
    }
}
