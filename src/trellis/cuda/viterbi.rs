//! The encoder's block search on MLX's CUDA back-end: `kernels/cuda/viterbi.cu`, registered
//! through `mlx_fast_cuda_kernel`. It runs the same tail-biting Viterbi as the CPU encoder with
//! the same f32 operations and tie-breaking, so both produce the same paths (and the encoder the
//! same bytes) for the same input.
//!
//! One thread block codes one 256-weight block at a time with its `2^L` path costs in shared
//! memory, and walks over the blocks of a launch (at most [`MAX_CTAS`] thread blocks, each with
//! its own argmin workspace). Costs of `2^L` f32 must fit a block's shared memory, so the kernel
//! serves `L <= 15` ([`MAX_L`]); the encoder uses its CPU search above that.

use crate::array::MlxArray;
use crate::device::{backend, Backend, Stream};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::kernel::registry::{self, KernelKey, KernelText};
use crate::kernel::sources;
use crate::kernel::{CudaKernel, LaunchConfig};

const SOURCE: &str = sources::CUDA_VITERBI;

/// The block length the kernel codes.
const T: usize = 256;

/// The largest state width the kernel serves (`2^15` f32 costs: 128 KiB of shared memory).
pub const MAX_L: u32 = 15;

/// The most thread blocks one launch uses (each walks over `blocks / MAX_CTAS` blocks).
pub const MAX_CTAS: usize = 1024;

/// The most argmin workspace one launch allocates (`thread blocks * 256 * 2^(L-k)` bytes).
const WORKSPACE_BYTES: usize = 256 << 20;

/// Threads per block: eight states each (their values then stay in registers up to `L = 13`),
/// between two and 32 warps. Every served (k, L) compiles to at most 48 registers per thread
/// (NVRTC for sm_90), within the 64 a 1024-thread block may use.
fn threads(l: u32) -> usize {
    ((1usize << l) / 8).clamp(64, 1024)
}

/// Dynamic shared memory: the costs, the group minima and the block (f32 each).
fn shared_bytes(k: u32, l: u32) -> usize {
    4 * ((1usize << l) + (1usize << (l - k)) + T)
}

/// Whether the kernel serves `k` bits per weight and `l` state bits.
pub fn supports(k: u32, l: u32) -> bool {
    (1..=8).contains(&k) && (8..=MAX_L).contains(&l) && l > k
}

/// The kernel for `(k, l)`: its shared memory depends on both, so each size is its own kernel
/// object, registered once per process.
fn kernel(k: u32, l: u32) -> Result<&'static CudaKernel> {
    let key = KernelKey { shared_memory: shared_bytes(k, l), ..KernelKey::of("viterbi") };
    registry::cuda(key, || {
        Ok(KernelText {
            inputs: &["x", "lut"],
            outputs: &["states", "scratch"],
            body: SOURCE.into(),
            header: String::new(),
        })
    })
}

/// The tail-biting Viterbi path of every block of `x` (`blocks * 256` weights, each block
/// already divided by its row's scale) through the trellis with `k` bits per weight and the
/// `2^l` state values `lut`: one state per weight, in order. Runs on the GPU stream; an error
/// on any back-end but CUDA.
pub fn search_blocks(x: &[f32], k: u32, l: u32, lut: &[f32]) -> Result<Vec<u16>> {
    if !supports(k, l) {
        invalid!("CUDA Viterbi: k = {k}, L = {l} is not served (needs 1 <= k < L, 8 <= L <= {MAX_L})");
    }
    if backend() != Backend::Cuda {
        invalid!("CUDA Viterbi: the loaded MLX has no CUDA back-end (it reports {})", backend());
    }
    if lut.len() != 1 << l {
        invalid!("CUDA Viterbi: {} state values given for L = {l} ({} expected)", lut.len(), 1usize << l);
    }
    if x.is_empty() || !x.len().is_multiple_of(T) {
        invalid!("CUDA Viterbi: {} weights are not a positive number of {T}-weight blocks", x.len());
    }
    let blocks = x.len() / T;
    if i32::try_from(blocks).is_err() {
        invalid!("CUDA Viterbi: {blocks} blocks in one call (at most {})", i32::MAX);
    }
    let groups = 1usize << (l - k);
    let ctas = blocks.min(MAX_CTAS).min((WORKSPACE_BYTES / (T * groups)).max(1));
    let nt = threads(l);

    let gpu = Stream::gpu()?;
    let _on_gpu = gpu.enter();
    let x = MlxArray::from_slice(x, &[blocks, T])?;
    let lut = MlxArray::from_slice(lut, &[lut.len()])?;
    let launch = LaunchConfig::new([ctas * nt, 1, 1], [nt, 1, 1])
        .output(&[blocks, T], Dtype::Uint16)
        .output(&[ctas, T, groups], Dtype::Uint8)
        .template_int("K", k as i32)
        .template_int("L", l as i32)
        .template_int("NT", nt as i32);
    let states = kernel(k, l)?.apply(&[&x, &lut], &launch)?.remove(0);
    states.to_vec::<u16>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_shape_fits_a_block() {
        for l in 8..=MAX_L {
            for k in 1..l.min(9) {
                let nt = threads(l);
                assert!(nt.is_power_of_two() && (64..=1024).contains(&nt), "k {k} L {l}: {nt} threads");
                assert_eq!((1usize << l) % nt, 0, "k {k} L {l}: whole states per thread");
                // 227 KiB is the most dynamic shared memory a Hopper block may use.
                assert!(shared_bytes(k, l) <= 227 * 1024, "k {k} L {l}: {} bytes", shared_bytes(k, l));
            }
        }
        assert!(!supports(3, 16) && !supports(8, 8) && !supports(0, 12) && supports(8, 9));
    }

    #[test]
    fn bad_calls_are_errors_that_name_the_problem() {
        let lut = vec![0f32; 1 << 12];
        let err = search_blocks(&[0.0; 256], 3, 16, &lut).unwrap_err().to_string();
        assert!(err.contains("L = 16"), "{err}");
        if backend() == Backend::Cuda {
            let err = search_blocks(&[0.0; 100], 3, 12, &lut).unwrap_err().to_string();
            assert!(err.contains("100 weights"), "{err}");
            let err = search_blocks(&[0.0; 256], 3, 11, &lut).unwrap_err().to_string();
            assert!(err.contains("4096 state values"), "{err}");
        } else {
            let err = search_blocks(&[0.0; 256], 3, 12, &lut).unwrap_err().to_string();
            assert!(err.contains("no CUDA back-end"), "{err}");
        }
    }
}
