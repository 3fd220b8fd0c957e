//! What the Metal kernel families share to register and launch their kernels: the launch
//! constants, the registration of a family's kernel once
//! ([`family_kernel`], [`registered_kernel`]), the launch of a split-K kernel
//! ([`partials_launch`]) and the one fold of its partials ([`apply_and_fold`]: MLX's `sum` over
//! the splits, then the cast to the activation dtype).

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::kernel::registry::{self, KernelKey, KernelText};
use crate::kernel::{LaunchConfig, MetalKernel};

/// Threads per threadgroup (Metal) of the trellis kernels.
pub const TRELLIS_THREADS: usize = 128;

/// SIMD groups of 32 lanes per threadgroup.
pub const TRELLIS_SG_PER_TG: usize = 4;

/// The Metal kernel of `family`, registered once from `body()` and the concatenated `headers`
/// with the upstream arguments (`x, codes, scales -> partial`).
pub(crate) fn family_kernel(
    family: &'static str,
    body: impl FnOnce() -> &'static str,
    headers: &[&str],
) -> Result<&'static MetalKernel> {
    registered_kernel(
        KernelKey::of(family),
        &["x", "codes", "scales"],
        &["partial"],
        || Ok(body().to_string()),
        headers,
    )
}

/// The Metal kernel of `key` with its own argument names (the axis-1 families write their
/// output in place of partials, and their fused variant reads a second code tensor), registered
/// once from `body()` (a variant cut from a family file) and the concatenated `headers`.
pub(crate) fn registered_kernel(
    key: KernelKey,
    inputs: &'static [&'static str],
    outputs: &'static [&'static str],
    body: impl FnOnce() -> Result<String>,
    headers: &[&str],
) -> Result<&'static MetalKernel> {
    registry::metal(key, || Ok(KernelText { inputs, outputs, body: body()?, header: headers.concat() }))
}

/// The launch of a split-K kernel: `grid` threads in threadgroups of `threads` along x, template
/// type `T` the activations' dtype, and one output, the f32 partials `[M, splits, cols]` (`M` the
/// rows of `x2`) that [`apply_and_fold`] folds.
pub(crate) fn partials_launch(
    grid: [usize; 3],
    threads: usize,
    x2: &MlxArray,
    splits: usize,
    cols: usize,
) -> LaunchConfig {
    let m = x2.shape().first().copied().unwrap_or(0);
    LaunchConfig::new(grid, [threads, 1, 1]).output(&[m, splits, cols], Dtype::Float32).template_dtype("T", x2.dtype())
}

/// Runs `kernel` on `x2, codes, scales` and folds its partials `[M, splits, C]` (as
/// [`partials_launch`] sets them up) to `[M, C]` in `x2`'s dtype.
pub(crate) fn apply_and_fold(
    kernel: &MetalKernel,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    launch: &LaunchConfig,
) -> Result<MlxArray> {
    let partial = kernel.apply(&[x2, codes, scales], launch)?.remove(0);
    partial.sum_axes(&[1], false)?.astype(x2.dtype())
}
