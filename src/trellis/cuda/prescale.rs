//! The activations pre-pass (`kernels/cuda/prescale.cu`): the power of two that brings each
//! activation row into f16's range (its exponent to `x_exp`), and the rows converted with it
//! once per call for the kernels that read f16 activations ready-made (the down kernel's
//! prescaled configurations; the axis-1 kernel's bf16 activations of many rows). The down
//! kernel's other configurations take only the exponents and the zeroed fold counters from it.
//! One thread block a row.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText};
use crate::kernel::sources;
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::int;

/// Threads of a row's block (the kernel's `THREADS`): 17408 inputs are 2176 groups of 8, at most
/// five a thread, all in flight at once.
const THREADS: usize = 512;

/// The pre-pass kernel, registered once per variant: one scale vector, or (`pair`) two, for the
/// down kernel's pair of matrices (see `prescale.cu`).
pub(crate) fn kernel(pair: bool) -> Result<&'static CudaKernel> {
    let key = KernelKey { variant: if pair { "pair" } else { "" }, ..KernelKey::of("prescale") };
    registry::cuda(key, || {
        Ok(KernelText {
            inputs: if pair { &["x", "scales", "scales_b"] } else { &["x", "scales"] },
            outputs: &["x_scaled", "counters", "x_exp", "x_sum"],
            body: source_variant(sources::CUDA_PRESCALE, PAIR_FLAG, pair)
                .context("CUDA pre-pass source prescale.cu")?,
            header: [sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT].join("\n"),
        })
    })
}

/// The pre-pass's four outputs, in the kernel's order (see [`PrePass`] for their shapes).
pub(crate) struct PrePassArrays {
    /// The converted activations (a placeholder with [`PrePassOutput::ExponentsOnly`]).
    pub x_scaled: MlxArray,
    /// The fold counters, zeroed.
    pub counters: MlxArray,
    /// The rows' exponents.
    pub x_exp: MlxArray,
    /// The converted rows' sums (a placeholder without `row_sums`).
    pub x_sum: MlxArray,
}

/// Runs the pre-pass (`pair`: the two-vector variant) of `launch` on `inputs`; `what` names the
/// caller in its error.
pub(crate) fn run(pair: bool, inputs: &[&MlxArray], launch: &CudaLaunch, what: &str) -> Result<PrePassArrays> {
    let outs =
        kernel(pair)?.apply_prepared(inputs, launch).with_context(|| format!("{what}: the activations' pre-pass"))?;
    let Ok([x_scaled, counters, x_exp, x_sum]) = <[MlxArray; 4]>::try_from(outs) else {
        unreachable!("the pre-pass kernel registers four outputs (`kernel`)");
    };
    Ok(PrePassArrays { x_scaled, counters, x_exp, x_sum })
}

/// The section flag of the pair variants of `prescale.cu` and `down_mma.cu`.
pub(crate) const PAIR_FLAG: &str = "TRELLIS_PAIR";

/// What the pre-pass writes besides the rows' exponents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrePassOutput {
    /// The converted activations, `[sets · m, row_pad]`.
    Activations,
    /// Nothing more (`x_scaled` is a placeholder of 8 values).
    ExponentsOnly,
}

/// One pre-pass launch: `m` rows of `width` activations in `dtype`. Its outputs are `x_scaled`
/// f16 `[sets · m, row_pad]` (`sets` 2 for f32, whose residues follow as `m` more rows),
/// `counters` u32 `[max(counters, 1)]` zeroed, `x_exp` f16 `[m]` (the rows' exponents) and
/// `x_sum` f32 `[m]` (with `row_sums`, each converted row's sum; `[1]` otherwise); with `pair`
/// (two scale vectors) `x_scaled`, `x_exp` and `x_sum` hold the second vector's rows after the
/// first's, `[2 · sets · m, row_pad]`, `[2 · m]` and `[2 · m]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrePass {
    /// Activation rows of the call.
    pub m: usize,
    /// Activations per row.
    pub width: usize,
    /// Length of a converted row: `width` padded with zeros.
    pub row_pad: usize,
    /// The activations' dtype.
    pub dtype: Dtype,
    /// Fold counters to zero for the kernel that follows (0: none).
    pub counters: usize,
    /// Multiply by the per-input scales first (the down projection's).
    pub row_scales: bool,
    /// What it writes besides the exponents.
    pub output: PrePassOutput,
    /// Two scale vectors: the down kernel's pair variant.
    pub pair: bool,
    /// Also each converted row's sum (16-bit activations written out only): the decode-once
    /// GEMM's bias fold.
    pub row_sums: bool,
    /// Store each block of 256 converted values in the order the warpgroup GEMM's tensor cores
    /// read it (`gate_up_wgmma.cu`; 16-bit activations written out, unpadded rows of whole
    /// blocks).
    pub wgmma_order: bool,
    /// Store the converted rows as the warp-specialized GEMM's stages hold them, in passes of
    /// this many rows (`gate_up_ws.cu`; 16-bit activations written out, unpadded rows of whole
    /// blocks; the last pass's rows past `m` are zeros); 0: off.
    pub image_rows: usize,
}

impl PrePass {
    /// The launch, checked and prepared for the kernel of its variant.
    pub(crate) fn prepare(&self) -> Result<CudaLaunch> {
        let PrePass { m, width, row_pad, dtype, counters, row_scales, output, pair, row_sums, wgmma_order, image_rows } =
            *self;
        let sets = if dtype == Dtype::Float32 { 2 } else { 1 };
        let what = "CUDA prescale kernel";
        let mats = if pair { 2 } else { 1 };
        let write_x = output == PrePassOutput::Activations;
        // With the image order the grid also runs the last pass's rows past `m` (zeros).
        let padded = if image_rows > 0 { m.div_ceil(image_rows).checked_mul(image_rows) } else { Some(m) };
        let (Some(rows), Some(padded)) = (m.checked_mul(mats), padded) else {
            invalid!("{what}: {m} activation rows overflow the launch's sizes");
        };
        let (Some(grid_rows), Some(x_rows)) = (padded.checked_mul(mats), padded.checked_mul(mats * sets)) else {
            invalid!("{what}: {m} activation rows overflow the launch's sizes");
        };
        let x_shape = if write_x { [x_rows, row_pad] } else { [1, 8] };
        if row_sums && (!write_x || dtype == Dtype::Float32) {
            invalid!("{what}: row sums are of 16-bit activations written out (got {dtype}, {output:?})");
        }
        if wgmma_order && (!write_x || dtype == Dtype::Float32 || row_pad != width || width % 256 != 0) {
            invalid!("{what}: the warpgroup GEMM's order is for 16-bit rows of whole 256-input blocks, unpadded (got {dtype}, {width} of {row_pad}, {output:?})");
        }
        if image_rows > 0
            && (!write_x
                || dtype == Dtype::Float32
                || row_pad != width
                || width % 256 != 0
                || pair
                || wgmma_order
                || image_rows % 8 != 0)
        {
            invalid!("{what}: the warp-specialized GEMM's image order is for 16-bit rows of whole 256-input blocks, unpadded, in passes of whole 8-row groups (got {dtype}, {width} of {row_pad}, {output:?}, passes of {image_rows})");
        }
        // One block a row, the rows over grid y and z (CUDA's y and z hold at most 65535 each).
        let (grid_y, grid_z) = (grid_rows.min(65535), grid_rows.div_ceil(65535));
        if grid_z > 65535 {
            invalid!("{what}: {grid_rows} activation rows are too many for one launch grid (at most 65535 x 65535)");
        }
        let launch = LaunchConfig::new([THREADS, grid_y, grid_z], [THREADS, 1, 1])
            .output(&x_shape, Dtype::Float16)
            .output(&[counters.max(1)], Dtype::Uint32)
            .output(&[rows], Dtype::Float16)
            .output(&[if row_sums { rows } else { 1 }], Dtype::Float32)
            .template_dtype("T", dtype)
            .template_int("R", int(what, width)?)
            .template_int("R_PAD", int(what, row_pad)?)
            .template_int("COUNTERS", int(what, counters)?)
            .template_bool("SPLIT_X", dtype == Dtype::Float32)
            .template_bool("ROW_SCALES", row_scales)
            .template_bool("WRITE_X", write_x)
            .template_bool("ROW_SUMS", row_sums)
            .template_bool("WGMMA_ORDER", wgmma_order)
            .template_int("IMAGE_ROWS", int(what, image_rows)?)
            .template_int("THREADS", int(what, THREADS)?);
        kernel(pair)?.prepare(&launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-over of `m` bf16 rows of 512 inputs with their sums, in the warpgroup GEMM's order
    /// or (`image_rows` not 0) the warp-specialized GEMM's image order.
    fn ordered_hand_over(m: usize, wgmma_order: bool, image_rows: usize) -> PrePass {
        PrePass {
            m,
            width: 512,
            row_pad: 512,
            dtype: Dtype::Bfloat16,
            counters: 0,
            row_scales: false,
            output: PrePassOutput::Activations,
            pair: false,
            row_sums: true,
            wgmma_order,
            image_rows,
        }
    }

    /// The hand-overs outside an order's rows: f32, padded rows, rows of a part block, no rows
    /// written out. Each is refused before anything is registered or launched, so on every
    /// back-end, with an error that says `why`.
    fn refused(base: PrePass, more: &[PrePass], why: &str) {
        let common = [
            PrePass { dtype: Dtype::Float32, row_sums: false, ..base },
            PrePass { width: 500, row_pad: 512, ..base },
            PrePass { width: 640, row_pad: 640, ..base },
            PrePass { output: PrePassOutput::ExponentsOnly, row_sums: false, ..base },
        ];
        for bad in common.iter().chain(more) {
            let Err(err) = bad.prepare() else { panic!("{bad:?}: prepared") };
            let err = err.to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_warpgroup_order_outside_its_rows_is_an_error_that_says_so() {
        let why = "the warpgroup GEMM's order is for 16-bit rows of whole 256-input blocks";
        refused(ordered_hand_over(4, true, 0), &[], why);
    }

    #[test]
    fn the_image_order_outside_its_rows_is_an_error_that_says_so() {
        let base = ordered_hand_over(70, false, 72);
        let more =
            [PrePass { pair: true, ..base }, PrePass { wgmma_order: true, ..base }, PrePass { image_rows: 68, ..base }];
        refused(base, &more, "the warp-specialized GEMM's image order is for 16-bit rows");
        // Rows whose last pass overflows the sizes.
        let Err(err) = (PrePass { m: usize::MAX - 3, ..base }).prepare() else { panic!("prepared") };
        assert!(err.to_string().contains("overflow the launch's sizes"), "{err}");
    }
}
