//! The coded axis's rotation in one launch (`kernels/cuda/rotate.cu`): an axis-1 layer's input
//! `x · Q` padded with zeros to its stored columns, or an axis-0 layer's stored output cut to its
//! logical columns and turned back, `y · Qᵀ`. MLX's own operations take four launches for each
//! (a copy to f32, the signs' product, `hadamard_transform`, a copy back; and the padding's or the
//! slice's own), a cost per launch that dominates small layers (docs/real-models.md, "Speed").
//! The kernel does the same f32 arithmetic in the same order, so its result is the same bits.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::int;
use crate::trellis::rotation::{Rotation, MAX_ROTATION_BLOCK};

/// The rotation kernel, registered once.
fn kernel() -> Result<&'static CudaKernel> {
    registry::cuda(KernelKey::of("rotate"), || {
        Ok(KernelText {
            inputs: &["x", "signs"],
            outputs: &["y"],
            body: sources::CUDA_ROTATE.into(),
            header: sources::CUDA_HADAMARD.into(),
        })
    })
}

/// Which way a rotation runs, with the row widths it reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `x [m, n] · Q`, written into rows of `stored` columns (zeros past `n`).
    Forward {
        /// The written row width (at least `n`).
        stored: usize,
    },
    /// `x[:, :n] · Qᵀ` of rows of `stored` columns, written into rows of `n`.
    Inverse {
        /// The read row width (at least `n`).
        stored: usize,
    },
}

/// Whether the kernel serves activations of `dtype` and a rotation block of `block`.
pub fn serves(dtype: Dtype, block: usize) -> bool {
    matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
        && block.is_power_of_two()
        && block <= MAX_ROTATION_BLOCK
}

/// `x · Q` (forward: `x [m, n]`, returned as `[m, stored]` with zeros past `n`) or
/// `x[:, :n] · Qᵀ` (inverse: `x [m, stored]`, returned as `[m, n]`) for the rotation `Q` of `n`
/// entries, in `x`'s dtype (f32, f16 or bf16), computed in f32 in one launch.
pub fn rotate(x: &MlxArray, rotation: &Rotation, direction: Direction) -> Result<MlxArray> {
    let signs = MlxArray::from_slice(rotation.signs(), &[rotation.len()])?;
    rotate_with_signs(x, &signs, rotation.len(), rotation.block(), direction)
}

/// [`rotate`] with the signs already on the device (f32 `[n]`) and the rotation's block.
pub(crate) fn rotate_with_signs(
    x: &MlxArray,
    signs: &MlxArray,
    n: usize,
    block: usize,
    direction: Direction,
) -> Result<MlxArray> {
    let (in_cols, out_cols) = match direction {
        Direction::Forward { stored } => (n, stored),
        Direction::Inverse { stored } => (stored, n),
    };
    let (m, cols) = match x.shape()[..] {
        [m, cols] => (m, cols),
        ref s => invalid!("CUDA rotation: expected activations [M, {in_cols}], got {s:?}"),
    };
    if cols != in_cols || signs.shape() != [n] {
        invalid!(
            "CUDA rotation: activations {:?} and signs {:?} for {n} rotated columns of {in_cols}",
            x.shape(),
            signs.shape()
        );
    }
    if !serves(x.dtype(), block) || n == 0 || !n.is_multiple_of(block) || out_cols < n || in_cols < n {
        invalid!(
            "CUDA rotation: {} activations, {n} columns in blocks of {block}, rows of {in_cols} -> {out_cols}",
            x.dtype()
        );
    }
    if m == 0 {
        return MlxArray::zeros(&[0, out_cols], x.dtype());
    }
    let key = (m, x.dtype(), n, block, direction);
    static LAUNCHES: LaunchCache<(usize, Dtype, usize, usize, Direction), CudaLaunch> = LaunchCache::new(1024);
    let launch = LAUNCHES.get_or_build(key, || prepare(m, x.dtype(), n, block, in_cols, out_cols, direction))?;
    Ok(kernel()?.apply_prepared(&[x, signs], &launch)?.remove(0))
}

/// The launch of [`rotate`] for `m` rows (see `kernels/cuda/rotate.cu` for the grid).
fn prepare(
    m: usize,
    dtype: Dtype,
    n: usize,
    block: usize,
    in_cols: usize,
    out_cols: usize,
    direction: Direction,
) -> Result<CudaLaunch> {
    let what = "CUDA rotation";
    let threads = (block / 2).max(1);
    let blocks = out_cols.div_ceil(block);
    let Some(grid_x) = blocks.checked_mul(threads).filter(|&g| i32::try_from(g).is_ok()) else {
        invalid!("{what}: {out_cols} columns in blocks of {block} are too many for one launch grid");
    };
    // The host's scale, so that the product is the one `hadamard_transform` takes.
    let scale = 1.0 / (block as f32).sqrt();
    let launch = LaunchConfig::new([grid_x, m.min(65535), 1], [threads, 1, 1])
        .output(&[m, out_cols], dtype)
        .template_dtype("T", dtype)
        .template_int("N", int(what, n)?)
        .template_int("B", int(what, block)?)
        .template_int("IN_COLS", int(what, in_cols)?)
        .template_int("OUT_COLS", int(what, out_cols)?)
        .template_int("SCALE_BITS", scale.to_bits() as i32)
        .template_bool("INVERSE", matches!(direction, Direction::Inverse { .. }));
    kernel()?.prepare(&launch)
}
