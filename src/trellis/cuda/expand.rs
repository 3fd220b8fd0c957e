//! Dense weights on MLX's CUDA back-end: `kernels/cuda/expand.cu`, registered through
//! `mlx_fast_cuda_kernel`, decodes a stored matrix to `[rows, cols]` in f32, f16 or bf16 with
//! the reference's values (bit for bit in f32; the same value rounded once in 16 bits).
//!
//! [`down_cuda_dense`] is the CUDA down projection for many activation rows: decode once, then
//! MLX's own matmul. The decode costs about one write of the dense layer (178 MB in bf16 for the
//! Qwen down projection), independent of the row count, while the fused kernel's tensor-core
//! work grows with it; [`down_cuda`](super::down::down_cuda) switches at
//! [`DENSE_MIN_ROWS`](super::down::DENSE_MIN_ROWS).

use std::sync::Arc;

use crate::array::MlxArray;
use crate::device::{backend, Backend};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};

use crate::kernel::sources;
use crate::trellis::checks::{check_layer, check_operands, int};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

const SOURCE: &str = sources::CUDA_EXPAND;

/// Weights one thread writes (`NPOS` in the kernel: two 16-byte stores in 16-bit dtypes).
const WEIGHTS_PER_THREAD: usize = 16;

/// Whether the kernel serves this geometry: T 256 or a shorter block of a multiple of 64
/// ([`serves_block_len`](super::serves_block_len)), L <= 16, k in 2..=8, whole blocks per row
/// (either axis: it decodes the stored matrix as stored).
pub fn supports(g: &TrellisGeometry) -> bool {
    super::serves_block_len(g.t) && g.l <= 16 && (2..=8).contains(&g.k) && g.cols.is_multiple_of(g.t as usize)
}

fn kernel() -> Result<&'static CudaKernel> {
    registry::cuda(KernelKey::of("expand"), || {
        Ok(KernelText {
            inputs: &["codes", "scales"],
            outputs: &["weights"],
            body: SOURCE.into(),
            header: sources::CUDA_CODEBOOK.into(),
        })
    })
}

/// The stored matrix `[rows, cols]` as dense weights of `dtype` (f32, f16 or bf16), decoded on
/// the GPU: `value(state) * f32(scale[r])` as [`reference::expand`](crate::trellis::reference::expand)
/// computes it, rounded once to `dtype`. `codes` and `scales` are the layer's (uint32 in its
/// layout, f16 `[rows]`). An error on any back-end but CUDA.
pub fn expand_cuda(codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry, dtype: Dtype) -> Result<MlxArray> {
    if !supports(g) {
        invalid!(
            "CUDA expand kernel: unsupported geometry {g} (needs T 256 or a multiple of 64 below it, L <= 16, k 2..=8)"
        );
    }
    if backend() != Backend::Cuda {
        invalid!("CUDA expand kernel: the loaded MLX has no CUDA back-end (it reports {})", backend());
    }
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        invalid!("CUDA expand kernel: dense weights of {dtype} (float32, float16 or bfloat16 only)");
    }
    check_layer("CUDA expand kernel", codes, scales, g)?;
    let prepared = prepared_launch(g, dtype)?;
    Ok(prepared.kernel.apply_prepared(&[codes, scales], &prepared.launch)?.remove(0))
}

/// The kernel and its launch, prepared once per geometry and dtype.
struct Prepared {
    kernel: &'static CudaKernel,
    launch: CudaLaunch,
}

/// The launch depends on the geometry and the output dtype only: one thread per 16 weights of
/// the stored matrix.
fn prepared_launch(g: &TrellisGeometry, dtype: Dtype) -> Result<Arc<Prepared>> {
    static LAUNCHES: LaunchCache<(TrellisGeometry, Dtype), Prepared> = LaunchCache::new(1024);
    LAUNCHES.get_or_build((*g, dtype), || {
        let threads = g.rows * g.cols / WEIGHTS_PER_THREAD;
        if i32::try_from(threads).is_err() {
            invalid!("CUDA expand kernel: {g} needs {threads} threads, more than one launch grid holds (2^31 - 1)");
        }
        // Threads per row are a multiple of 4 (cols % 64 == 0); the widest block that divides.
        let block = [256, 128, 64, 32, 16, 8, 4].into_iter().find(|b| threads.is_multiple_of(*b)).unwrap_or(4);
        let launch = LaunchConfig::new([threads, 1, 1], [block, 1, 1])
            .output(&[g.rows, g.cols], dtype)
            .template_dtype("T", dtype)
            .template_int("R", int("CUDA expand kernel", g.rows)?)
            .template_int("C", int("CUDA expand kernel", g.cols)?)
            .template_int("K", g.k as i32)
            .template_int("L", g.l as i32)
            .template_int("BLOCK_LEN", g.t as i32)
            .template_bool("INTERLEAVE", g.layout() == CodeLayout::K3Interleaved);
        let kernel = kernel()?;
        Ok(Prepared { kernel, launch: kernel.prepare(&launch)? })
    })
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype by decoding `W` to dense weights of that dtype
/// ([`expand_cuda`]) and multiplying with MLX's matmul. Needs `2 * in * out` bytes of scratch
/// for 16-bit activations; f32 activations multiply in TF32 on CUDA unless
/// `MLX_ENABLE_TF32=0`, so the planned dispatch keeps them on the fused kernel.
pub fn down_cuda_dense(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    if g.axis != 0 {
        invalid!("CUDA dense down projection: {g} is not stored [in, out] (axis 0)");
    }
    check_operands("CUDA dense down projection", x2, codes, scales, g)?;
    let weights = expand_cuda(codes, scales, g, x2.dtype())?;
    x2.matmul(&weights)
}

#[cfg(test)]
mod tests {
    use crate::trellis::format::codebook::{value, TRELLIS_RCP, TRELLIS_SCALE};

    /// The kernel's division, on the host: `y * rcp` and one FMA correction of its residual.
    fn kernel_value(y: f32) -> f32 {
        let d = TRELLIS_SCALE as f32;
        let q0 = y * TRELLIS_RCP;
        (-q0).mul_add(d, y).mul_add(TRELLIS_RCP, q0)
    }

    #[test]
    fn the_kernels_division_is_correctly_rounded_for_every_code_value() {
        // Every y the code produces (byte sums 0..=1020 minus 510), against the reference's
        // value of a state with that y: the f64 quotient rounded to f32.
        for y in -510..=510 {
            let want = ((y as f64) / TRELLIS_SCALE) as f32;
            assert_eq!(kernel_value(y as f32).to_bits(), want.to_bits(), "y = {y}");
        }
        // And `value` is that quotient (state 0's y, as a spot check of the definition).
        let y0 = crate::trellis::format::codebook::y(0);
        assert_eq!(value(0), kernel_value(y0 as f32));
    }
}
