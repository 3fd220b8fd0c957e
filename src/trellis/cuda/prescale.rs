//! The activations pre-pass (`kernels/cuda/prescale.cu`): each activation row brought into f16's
//! range by a power of two of its own and converted once per call, for the kernels that read
//! f16 activations ready-made (the down kernel's prescaled configurations; the axis-1 kernel's
//! bf16 activations of many rows). One thread block a row; the row's exponent goes to `x_exp`.

use crate::dtype::Dtype;
use crate::error::Result;
use crate::kernel::registry::{self, KernelKey, KernelText};
use crate::kernel::sources;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::int;

/// Threads of a row's block: 17408 inputs are 2176 groups of 8, about four a thread.
const THREADS: usize = 512;

/// The pre-pass kernel, registered once.
pub(crate) fn kernel() -> Result<&'static CudaKernel> {
    registry::cuda(KernelKey::of("prescale"), || {
        Ok(KernelText {
            inputs: &["x", "scales"],
            outputs: &["x_scaled", "counters", "x_exp"],
            body: sources::CUDA_PRESCALE.into(),
            header: [sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT].join("\n"),
        })
    })
}

/// The pre-pass's launch for `m` rows of `width` activations in `dtype`: outputs `x_scaled`
/// f16 `[sets · m, row_pad]` (`sets` 2 for f32, whose residues follow as `m` more rows),
/// `counters` u32 `[max(counters, 1)]` zeroed, and `x_exp` f16 `[m]` (the rows' exponents).
/// `row_scales`: multiply by the per-input scales first (the down projection's).
pub(crate) fn prepare(
    m: usize,
    width: usize,
    row_pad: usize,
    dtype: Dtype,
    counters: usize,
    row_scales: bool,
) -> Result<CudaLaunch> {
    let sets = if dtype == Dtype::Float32 { 2 } else { 1 };
    let what = "CUDA prescale kernel";
    let launch = LaunchConfig::new([THREADS, m, 1], [THREADS, 1, 1])
        .output(&[sets * m, row_pad], Dtype::Float16)
        .output(&[counters.max(1)], Dtype::Uint32)
        .output(&[m], Dtype::Float16)
        .template_dtype("T", dtype)
        .template_int("R", int(what, width)?)
        .template_int("R_PAD", int(what, row_pad)?)
        .template_int("COUNTERS", int(what, counters)?)
        .template_bool("SPLIT_X", dtype == Dtype::Float32)
        .template_bool("ROW_SCALES", row_scales);
    kernel()?.prepare(&launch)
}
