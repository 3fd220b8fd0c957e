//! [`AxisOneConfig`]: which CUDA axis-1 kernel one call runs ([`AxisOneKernel`]: `gate_up.cu`,
//! `gate_up_int8.cu`, `gate_up_gemm.cu`, `gate_up_wgmma.cu` or `gate_up_ws.cu` under
//! `kernels/cuda/`) and how it is shaped, the limits of each kernel, its checks and the shared
//! memory each shape takes. The plan that picks a shape for a row count is `plan.rs`.

use crate::dtype::Dtype;
use crate::error::{invalid, Result};

/// The static shared memory a thread block may take (the warps' sums for warp 0 to add).
const STATIC_SHARED_LIMIT: usize = 48 * 1024;

/// The most activation rows the int8 kernel takes (its template int `R`: the MMA's 8 columns).
pub const INT8_MAX_ROWS: usize = 8;

/// The dynamic shared memory a thread block may take on the GPUs MLX's CUDA back-end serves
/// (227 KB on sm_90; MLX raises a kernel's limit above 48 KB).
const DYNAMIC_SHARED_LIMIT: usize = 227 * 1024;

/// The most shared memory the staged rows may take: with the kernel's own 5–7 KB, a thread block
/// stays within the 45 KB that leaves an SM the five blocks its registers allow (96 a thread).
const STAGE_MAX_BYTES: usize = 38 * 1024;

/// Thread blocks a pass of the warp-specialized GEMM ([`AxisOneKernel::Specialized`]): one on
/// each of an H200's 132 SMs (its shared memory and registers leave room for one).
pub const WS_CTAS: u32 = 132;

/// Warps an SM the staged fragment kernel's registers leave room for (its launch bounds, in
/// blocks of its warps; 0: no bounds): 20, five 4-warp blocks of at most 96 registers. Without
/// bounds ptxas gives it 96 with some NVRTC versions and 98 (four blocks) with others, the
/// H200's among them; bounded, 95 without spills. In the chain at 1–2 rows the bounded kernel
/// measured within the runs' spread of the unbounded one (docs/cuda-mlp.md): the bounds keep
/// the residency from depending on the NVRTC version, not a measured gain. The int8 kernel's
/// bounds take the same cap ([`AxisOneConfig::int8_resident_blocks`]).
pub const STAGED_RESIDENT_WARPS: u32 = 20;

/// Which of the axis-1 kernels a call runs (each has the same variants: one projection, its
/// residual variant, the fused gate·up·SwiGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AxisOneKernel {
    /// `gate_up.cu`: code values decoded into f16 MMA fragments, the activations read by each
    /// lane; the warps of a thread block split a row's blocks. Every row count and dtype.
    Fragment,
    /// `gate_up_int8.cu`: the activations quantized to two int8 terms and multiplied on u8 x s8
    /// MMAs: 16-bit activations, one to [`INT8_MAX_ROWS`] rows, `mt` 1 and neither `bias_fold`
    /// nor `pack_fma`. 4.1 instructions a weight against the fragment kernel's 6.2, and the
    /// second term keeps the quantization's error below a 16-bit output's rounding; not planned,
    /// as it measured no faster (docs/cuda-mlp.md).
    Int8,
    /// `gate_up_gemm.cu`, the decode-once GEMM: the warps of a thread block own different 16-row
    /// output tiles and share the activations, staged per block of 256 inputs in shared memory
    /// (16-bit activations handed over as f16 by the pre-pass); each weight decoded once a pass
    /// of `8 mt` rows. `rt` 1 and no `pack_fma`; `bias_fold` takes each row's sum from the pre-pass.
    Gemm,
    /// `gate_up_wgmma.cu`, the same decode-once GEMM on Hopper's warpgroup MMA (sm_90a): the four
    /// warps of a warpgroup own 64 output rows, and each chunk of 16 inputs is one
    /// `wgmma.m64n(8 mt)k16` a matrix, its A fragments decoded into registers and its B read
    /// from the staged activations by the tensor cores. `warps` 4 or 8 (whole warpgroups), `rt`
    /// 1 and no `pack_fma`; the pre-pass hands the rows over in the order the tensor cores read
    /// them.
    Wgmma,
    /// `gate_up_ws.cu`, the warp-specialized decode-once GEMM on Hopper's warpgroup MMA (sm_90a):
    /// producer warps decode 64 output rows of each matrix into shared memory, the copy engine
    /// brings the activations (handed over by the pre-pass in the stages' image order), a
    /// consumer warpgroup multiplies both from shared memory (`wgmma.m64n(8 mt)k16`, `mt` 1 to
    /// 16: passes of up to 128 rows, each weight decoded once a pass), through a ring of
    /// `stages` steps of 64 inputs. Its grid is `ctas` thread blocks a
    /// pass, each taking an equal run of the pass's tiles' input blocks (stream-K; the tiles split
    /// between blocks folded in the kernel). `warps` 8 for one projection and 12 fused (the
    /// consumer warpgroup and four producers a matrix), `rt` 1 and no `pack_fma`.
    Specialized,
}

/// How one call of the axis-1 kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AxisOneConfig {
    /// 8-row MMA tiles of activation rows per pass (1 to 8).
    pub mt: u32,
    /// 16-row tiles of output rows per thread block (1 to 4); every tile of a block reuses its
    /// activation fragments.
    pub rt: u32,
    /// Warps per thread block (1 to 8). The fragment and int8 kernels' warps split each row's
    /// blocks and add their sums at the end; the GEMM's own a 16-row output tile each, or
    /// `split_k` warps a tile.
    pub warps: u32,
    /// Carry y + 1534 in the fragments and subtract the bias at the end (16-bit activations): the
    /// fragment kernel finds each row's sum with an MMA, the GEMM takes it from the pre-pass.
    pub bias_fold: bool,
    /// Pack half of the code pairs with an IMAD instead of a PRMT (needs `bias_fold`).
    pub pack_fma: bool,
    /// The kernel.
    pub kernel: AxisOneKernel,
    /// The GEMM only: read each block's code words one block ahead, into registers, instead of
    /// in two halves where the block before is done with them (fused, k 3, 64 rows: 182
    /// registers against 174 with the bias fold, NVRTC 13.0.88).
    pub prefetch: bool,
    /// The GEMM only: warps a 16-row output tile (dividing `warps`; 1 to 4), each multiplying
    /// every `split_k`-th block of 256 inputs, their sums added in shared memory at the end. A
    /// layer then has `split_k` times the warps of its tiles (Qwen3-14B's gate·up at 9–32 rows:
    /// 1,088 tiles, under half a wave of the GEMM's resident warps).
    pub split_k: u32,
    /// The GEMM only: warps a 16-row output tile (1, 2 or 4, dividing `warps`; with `split_k`
    /// 1), each multiplying its own `8 mt` rows of a pass of `8 mt row_split`; each chunk of the
    /// tile's weights is decoded by one of them and handed to the others in shared memory, so a
    /// pass of up to 128 (or 256) rows decodes each weight once. Not planned: on an H200 in
    /// Qwen3-14B's MLP chain it measured slower than the plan at 64 and 128 rows
    /// (docs/cuda-mlp.md, "A row split").
    pub row_split: u32,
    /// The fragment kernel only, 16-bit activations: each thread block first copies its pass's
    /// rows into shared memory as the f16 numbers its MMAs take, so the main loop reads them
    /// without a conversion or a global load. Where the rows do not fit
    /// ([`AxisOneConfig::stage_shared_bytes`]) the kernel reads them from global memory as
    /// without it: the same numbers, the same sums.
    pub stage: bool,
    /// The warp-specialized GEMM only: steps of 64 inputs in its ring of shared memory (4 to 7:
    /// the consumer frees a step once it has issued the next, and has the activations of the
    /// step `stages - 1` ahead copied into it then).
    pub stages: u32,
    /// The warp-specialized GEMM only: thread blocks a pass (1 to 65535), one an SM: the
    /// H200's 132 in the plan.
    pub ctas: u32,
}

impl AxisOneConfig {
    /// `kernel` in its plainest shape: one 8-row tile a pass, one row tile, 4 warps, neither the
    /// bias fold nor the IMAD pack (valid for each kernel with 16-bit activations); the base the
    /// benchmarks and tests vary.
    #[cfg(any(test, feature = "tuning"))]
    pub const fn plain(kernel: AxisOneKernel) -> AxisOneConfig {
        Self::plain_of(kernel)
    }

    /// [`plain`](Self::plain), for the plan too.
    pub(super) const fn plain_of(kernel: AxisOneKernel) -> AxisOneConfig {
        AxisOneConfig {
            mt: 1,
            rt: 1,
            warps: 4,
            bias_fold: false,
            pack_fma: false,
            kernel,
            prefetch: false,
            split_k: 1,
            row_split: 1,
            stage: false,
            stages: 4,
            ctas: WS_CTAS,
        }
    }

    /// Activation rows a pass: `8 mt` for each of the GEMM's `row_split` warps a tile.
    pub fn pass_rows(&self) -> usize {
        8 * self.mt as usize * self.row_split as usize
    }

    /// An error naming the first reason this shape cannot run `dtype` activations in the single
    /// projection or (`fused`) the gate·up·SwiGLU kernel.
    pub fn check(&self, dtype: Dtype, fused: bool) -> Result<()> {
        // The GEMM's row split takes up to 16 warps a block (four tiles of four warps).
        let most_warps = if matches!(self.kernel, AxisOneKernel::Gemm | AxisOneKernel::Specialized) { 16 } else { 8 };
        let most_mt = if self.kernel == AxisOneKernel::Specialized { 16 } else { 8 };
        if !(1..=most_mt).contains(&self.mt) || !(1..=4).contains(&self.rt) || !(1..=most_warps).contains(&self.warps) {
            invalid!(
                "CUDA axis-1 kernel: mt = {} (1..={most_mt}), rt = {} (1..=4), warps = {} (1..={most_warps} for the {:?} kernel) out of range",
                self.mt,
                self.rt,
                self.warps,
                self.kernel
            );
        }
        if self.pack_fma && !self.bias_fold {
            invalid!("CUDA axis-1 kernel: pack_fma packs the bias fold's pairs (needs bias_fold)");
        }
        if self.bias_fold && dtype == Dtype::Float32 {
            invalid!("CUDA axis-1 kernel: the bias fold is for 16-bit activations");
        }
        if self.prefetch && self.kernel != AxisOneKernel::Gemm {
            invalid!("CUDA axis-1 kernel: prefetch is the GEMM's (the {:?} kernel reads its code words as it goes)", self.kernel);
        }
        if self.split_k != 1 && (self.kernel != AxisOneKernel::Gemm || !(1..=4).contains(&self.split_k) || !self.warps.is_multiple_of(self.split_k)) {
            invalid!(
                "CUDA axis-1 kernel: split_k = {} is the GEMM's, 1 to 4 warps a tile dividing its {} warps (the {:?} kernel)",
                self.split_k,
                self.warps,
                self.kernel
            );
        }
        if self.row_split != 1
            && (self.kernel != AxisOneKernel::Gemm
                || !matches!(self.row_split, 2 | 4)
                || self.split_k != 1
                || !self.warps.is_multiple_of(self.row_split))
        {
            invalid!(
                "CUDA axis-1 kernel: row_split = {} is the GEMM's, 1, 2 or 4 warps a tile dividing its {} warps, without split_k (got split_k = {}, the {:?} kernel)",
                self.row_split,
                self.warps,
                self.split_k,
                self.kernel
            );
        }
        if self.stage && (self.kernel != AxisOneKernel::Fragment || dtype == Dtype::Float32) {
            invalid!("CUDA axis-1 kernel: stage is the fragment kernel's, for 16-bit activations (got the {:?} kernel, {dtype})", self.kernel);
        }
        match self.kernel {
            AxisOneKernel::Fragment => {}
            AxisOneKernel::Int8 => {
                if self.mt != 1 || self.bias_fold || self.pack_fma {
                    invalid!("CUDA axis-1 kernel: int8 activations take mt = 1 and neither bias_fold nor pack_fma");
                }
                if dtype == Dtype::Float32 {
                    // Its quantization error (2^-15 of a block's largest |x|) is within a 16-bit
                    // output's rounding, not f32's: f32 keeps the exact fragment kernel.
                    invalid!("CUDA axis-1 kernel: int8 activations are for 16-bit activations (got {dtype}); f32 keeps the fragment kernel");
                }
            }
            AxisOneKernel::Wgmma => {
                if self.rt != 1 || self.pack_fma || !matches!(self.warps, 4 | 8) {
                    invalid!("CUDA axis-1 warpgroup GEMM: warps = 4 or 8 (whole warpgroups), rt = 1 and no pack_fma");
                }
                if dtype == Dtype::Float32 {
                    invalid!("CUDA axis-1 warpgroup GEMM: for 16-bit activations (got {dtype}); f32 keeps the fragment kernel");
                }
            }
            AxisOneKernel::Specialized => {
                let warps = if fused { 12 } else { 8 };
                if self.rt != 1 || self.pack_fma || self.warps != warps {
                    invalid!("CUDA axis-1 warp-specialized GEMM: warps = {warps} (a consumer warpgroup and four producers a matrix), rt = 1 and no pack_fma (got warps = {}, rt = {})", self.warps, self.rt);
                }
                if !(4..=7).contains(&self.stages) || !(1..=65535).contains(&self.ctas) {
                    invalid!(
                        "CUDA axis-1 warp-specialized GEMM: stages = {} (4..=7) and ctas = {} (1..=65535) out of range",
                        self.stages,
                        self.ctas
                    );
                }
                let shared = self.ws_shared_bytes(fused);
                if shared > DYNAMIC_SHARED_LIMIT {
                    invalid!(
                        "CUDA axis-1 warp-specialized GEMM: {shared} bytes of shared memory (mt = {}, stages = {}; at most {DYNAMIC_SHARED_LIMIT})",
                        self.mt,
                        self.stages
                    );
                }
                if dtype == Dtype::Float32 {
                    invalid!("CUDA axis-1 warp-specialized GEMM: for 16-bit activations (got {dtype}); f32 keeps the fragment kernel");
                }
            }
            AxisOneKernel::Gemm => {
                if self.rt != 1 || self.pack_fma {
                    invalid!("CUDA axis-1 GEMM: rt = 1 (a warp a row tile) and no pack_fma");
                }
                let shared = self.gemm_shared_bytes(fused);
                if shared > DYNAMIC_SHARED_LIMIT {
                    invalid!(
                        "CUDA axis-1 GEMM: {shared} bytes of shared memory (mt = {}, split_k = {}, row_split = {}; at most {DYNAMIC_SHARED_LIMIT})",
                        self.mt,
                        self.split_k,
                        self.row_split
                    );
                }
                if dtype == Dtype::Float32 {
                    // It multiplies the f16 hand-over, one f16 term per activation: f32 keeps the
                    // fragment kernel's exact hi + lo pair.
                    invalid!("CUDA axis-1 GEMM: for 16-bit activations (got {dtype}); f32 keeps the fragment kernel");
                }
            }
        }
        let shared = self.shared_bytes(fused);
        if shared > STATIC_SHARED_LIMIT {
            invalid!(
                "CUDA axis-1 kernel: the sums of {} warps (rt = {}, mt = {}{}) take {shared} bytes of static shared memory (at most {STATIC_SHARED_LIMIT}; use fewer warps, row tiles or 8-row tiles)",
                self.warps,
                self.rt,
                self.mt,
                if fused { ", fused" } else { "" }
            );
        }
        Ok(())
    }

    /// The kernel's static shared memory. The fragment kernel's: `partial[max(WARPS - 1, 1)]
    /// [SLOTS][32]` f32, SLOTS being a lane's accumulators (one set per matrix) and bias sums,
    /// and each pass row's exponent and largest |x| (4 bytes each). The int8 kernel's and the
    /// GEMM's: none (theirs is dynamic).
    fn shared_bytes(&self, fused: bool) -> usize {
        let (mt, rt) = (self.mt as usize, self.rt as usize);
        let matrices = if fused { 2 } else { 1 };
        let other_warps = (self.warps as usize).saturating_sub(1).max(1);
        if self.kernel != AxisOneKernel::Fragment {
            return 0;
        }
        let slots = matrices * rt * mt * 4 + if self.bias_fold { mt * 4 } else { 0 };
        other_warps * slots * 32 * 4 + 2 * 8 * mt * 4
    }
}

impl AxisOneConfig {
    /// The int8 kernel's dynamic shared memory for `rows` activation rows of `inputs` (a multiple
    /// of 256) in this shape: per row, a table per term of 272 words for each block of 256 inputs
    /// (each q in all four bytes, and padding) and 16 more words, and each block's scale and two
    /// biases (12 bytes); or, where they take more, the other warps' sums (4 per matrix and row
    /// tile a lane), which reuse the tables after the main loop. `None` where that overflows or
    /// exceeds what a thread block may take.
    pub fn int8_shared_bytes(&self, rows: usize, inputs: usize, fused: bool) -> Option<usize> {
        let blocks = inputs / 256;
        let tables = rows.checked_mul(blocks.checked_mul(2 * 272 * 4 + 12)?.checked_add(2 * 16 * 4)?)?;
        let matrices = if fused { 2 } else { 1 };
        let sums = (self.warps as usize).saturating_sub(1) * matrices * self.rt as usize * 4 * 32 * 4;
        Some(tables.max(sums)).filter(|&bytes| bytes <= DYNAMIC_SHARED_LIMIT)
    }

    /// Thread blocks an SM for the int8 kernel's launch bounds, each taking `shared` bytes (from
    /// [`int8_shared_bytes`](Self::int8_shared_bytes)): as many as an SM's shared memory holds
    /// (each block also takes the 1 KB the runtime reserves), and no more than
    /// [`STAGED_RESIDENT_WARPS`] warps. Without bounds ptxas may give the kernel more registers
    /// than that many blocks leave room for.
    pub fn int8_resident_blocks(&self, shared: usize) -> u32 {
        let by_shared = DYNAMIC_SHARED_LIMIT / shared.saturating_add(1024);
        (STAGED_RESIDENT_WARPS / self.warps.max(1)).min(by_shared as u32).max(1)
    }

    /// The fragment kernel's dynamic shared memory for `m` rows of `inputs` with `stage`: a pass's
    /// rows (at most `8 mt`) of `inputs + inputs / 8 + 32` halves (8 of padding after every 64
    /// positions and 32 at the end, so that the lanes of a chunk read different banks). `None`
    /// where the rows do not fit (above 38 KB, or an overflow) and `Some(0)`
    /// without `stage`: the kernel then reads the rows from global memory.
    pub fn stage_shared_bytes(&self, m: usize, inputs: usize) -> Option<usize> {
        if !self.stage {
            return Some(0);
        }
        let rows = m.min(8 * self.mt as usize);
        let pitch = inputs.checked_add(inputs / 8)?.checked_add(32)?;
        rows.checked_mul(pitch)?.checked_mul(2).filter(|&bytes| bytes <= STAGE_MAX_BYTES)
    }

    /// The GEMM's dynamic shared memory: two stages of `split_k` blocks of a pass's rows
    /// ([`pass_rows`](Self::pass_rows)) of 288 halves (a block of 256 inputs, padded so that the B
    /// loads hit distinct banks), then each pass row's factor and bias (4 bytes each), then with
    /// `row_split` the fragments its warps hand each other: two buffers of a step's chunks (2, or
    /// 4 at `row_split` 4) of each matrix (two `fused`), 512 bytes each, for every tile. After the
    /// main loop the stages hold the splits' sums, which always fit in them: at most 16 warps of
    /// two matrices' accumulators, 1 KB a warp for each 8-row tile, against the stages' 9.2 KB a
    /// tile for each split. 74.2 KB at 64 rows a pass unsplit.
    pub fn gemm_shared_bytes(&self, fused: bool) -> usize {
        let rows = self.pass_rows();
        let handed = if self.row_split > 1 {
            let tiles = (self.warps / self.row_split) as usize;
            let chunks = (self.row_split as usize).max(2);
            tiles * 2 * chunks * if fused { 2 } else { 1 } * 512
        } else {
            0
        };
        2 * self.split_k as usize * rows * 288 * 2 + 2 * rows * 4 + handed
    }

    /// The warpgroup GEMM's dynamic shared memory: two stages of `8 mt` rows of a block of 256
    /// inputs as core matrices (512 bytes a row, no padding: the tensor cores read whole 128-byte
    /// core matrices), then each pass row's factor and bias. At most 64.5 KB (`mt` 8).
    pub fn wgmma_shared_bytes(&self) -> usize {
        let rows = 8 * self.mt as usize;
        2 * rows * 512 + 2 * rows * 4
    }

    /// The warp-specialized GEMM's dynamic shared memory: `stages` steps, each 64 output rows of
    /// each matrix (two `fused`) and the pass's `8 mt` rows of 64 inputs (8 KB and 128 bytes a
    /// row), then each pass row's factor and bias, each stage's mbarrier and the fold's flag. 193
    /// KB fused at 128 rows and the plan's 6 stages.
    pub fn ws_shared_bytes(&self, fused: bool) -> usize {
        let (rows, mats, stages) = (8 * self.mt as usize, if fused { 2 } else { 1 }, self.stages as usize);
        stages * (mats * 64 * 64 * 2 + rows * 64 * 2) + 2 * rows * 4 + 8 * stages + 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_shapes_outside_its_kernel_are_errors_that_say_so() {
        let wgmma = AxisOneConfig { mt: 8, bias_fold: true, ..AxisOneConfig::plain(AxisOneKernel::Wgmma) };
        for warps in [4, 8] {
            AxisOneConfig { warps, ..wgmma }.check(Dtype::Bfloat16, true).unwrap();
            AxisOneConfig { warps, ..wgmma }.check(Dtype::Float16, false).unwrap();
        }
        for bad in [
            AxisOneConfig { warps: 3, ..wgmma },
            AxisOneConfig { warps: 1, ..wgmma },
            AxisOneConfig { rt: 2, ..wgmma },
            AxisOneConfig { pack_fma: true, ..wgmma },
        ] {
            let err = bad.check(Dtype::Bfloat16, true).unwrap_err().to_string();
            assert!(err.contains("warps = 4 or 8 (whole warpgroups)"), "{bad:?}: {err}");
        }
        let err = AxisOneConfig { prefetch: true, ..wgmma }.check(Dtype::Bfloat16, true).unwrap_err().to_string();
        assert!(err.contains("prefetch is the GEMM's"), "{err}");
        let err = AxisOneConfig { bias_fold: false, ..wgmma }.check(Dtype::Float32, false).unwrap_err().to_string();
        assert!(err.contains("warpgroup GEMM: for 16-bit activations (got float32)"), "{err}");
        // Two stages of 64 rows of 512 bytes, then 64 factors and 64 biases.
        assert_eq!(wgmma.wgmma_shared_bytes(), 2 * 64 * 512 + 512);
        assert_eq!(AxisOneConfig { mt: 1, ..wgmma }.wgmma_shared_bytes(), 2 * 8 * 512 + 64);
    }

    #[test]
    fn int8_tables_are_sized_and_bounded() {
        let int8 = AxisOneConfig::plain(AxisOneKernel::Int8);
        // Qwen3-14B's hidden width at one row: 43 KB of tables, which the 3 other warps' sums reuse.
        assert_eq!(int8.int8_shared_bytes(1, 5120, true), Some(20 * 2188 + 128));
        assert_eq!(int8.int8_shared_bytes(1, 5120, false), Some(20 * 2188 + 128));
        // One block of 256 inputs: the fused variant's sums (3 warps × 2 matrices × 512 bytes)
        // take more than the tables.
        assert_eq!(int8.int8_shared_bytes(1, 256, true), Some(3 * 2 * 4 * 32 * 4));
        assert_eq!(int8.int8_shared_bytes(1, 256, false), Some(2188 + 128));
        // Five 4-warp blocks an SM at one row of 5120 inputs (the fragment kernel's residency),
        // two at two rows, one where a block's tables fill the SM.
        let blocks = |rows, inputs| int8.int8_resident_blocks(int8.int8_shared_bytes(rows, inputs, true).unwrap());
        assert_eq!(blocks(1, 5120), 5);
        assert_eq!(blocks(2, 5120), 2);
        assert_eq!(blocks(1, 256), 5);
        assert_eq!(int8.int8_resident_blocks(200 * 1024), 1);
        // 8 rows of 4096 inputs: 281 KB, more than a block may take; sizes that overflow.
        assert_eq!(int8.int8_shared_bytes(8, 4096, true), None);
        assert_eq!(int8.int8_shared_bytes(usize::MAX, 1 << 20, true), None);
    }

    #[test]
    fn int8_shapes_outside_its_kernel_are_errors_that_say_so() {
        let int8 = AxisOneConfig::plain(AxisOneKernel::Int8);
        int8.check(Dtype::Float16, true).unwrap();
        int8.check(Dtype::Bfloat16, false).unwrap();
        let err = int8.check(Dtype::Float32, true).unwrap_err().to_string();
        assert!(err.contains("int8 activations are for 16-bit activations"), "{err}");
        for bad in [AxisOneConfig { mt: 2, ..int8 }, AxisOneConfig { bias_fold: true, ..int8 }] {
            let err = bad.check(Dtype::Bfloat16, false).unwrap_err().to_string();
            assert!(err.contains("int8 activations take mt = 1"), "{err}");
        }
    }

    #[test]
    fn split_k_is_the_gemms_and_divides_its_warps() {
        let gemm = AxisOneConfig { mt: 2, warps: 6, split_k: 2, ..AxisOneConfig::plain(AxisOneKernel::Gemm) };
        gemm.check(Dtype::Bfloat16, true).unwrap();
        // Two stages of two blocks of 16 rows, and the rows' factors and biases.
        assert_eq!(gemm.gemm_shared_bytes(true), 2 * 2 * 16 * 576 + 2 * 16 * 4);
        for bad in [
            AxisOneConfig { warps: 4, split_k: 3, ..gemm },
            AxisOneConfig { warps: 8, split_k: 8, ..gemm },
            AxisOneConfig { split_k: 0, ..gemm },
            AxisOneConfig { kernel: AxisOneKernel::Fragment, ..gemm },
            AxisOneConfig { kernel: AxisOneKernel::Wgmma, warps: 4, ..gemm },
        ] {
            let err = bad.check(Dtype::Bfloat16, true).unwrap_err().to_string();
            assert!(err.contains("split_k"), "{bad:?}: {err}");
        }
        // Four blocks of 64 rows a stage do not fit in a thread block's shared memory.
        let err = AxisOneConfig { mt: 8, warps: 8, split_k: 4, ..gemm }.check(Dtype::Bfloat16, true).unwrap_err();
        assert!(err.to_string().contains("bytes of shared memory"), "{err}");
        AxisOneConfig { mt: 8, warps: 8, split_k: 2, ..gemm }.check(Dtype::Bfloat16, true).unwrap();
    }

    #[test]
    fn too_much_static_shared_memory_is_an_error_that_says_so() {
        // 7 warps' sums of 2 matrices x 4 row tiles x 8 tiles (256 a lane) and the bias (32).
        let big = AxisOneConfig { mt: 8, rt: 4, warps: 8, bias_fold: true, ..AxisOneConfig::plain(AxisOneKernel::Fragment) };
        let err = big.check(Dtype::Bfloat16, true).unwrap_err().to_string();
        assert!(err.contains("258560 bytes of static shared memory") && err.contains("at most 49152"), "{err}");
        // The single projection holds one set (160 sums a lane): 3 warps (two warps' sums) fit,
        // 4 do not.
        let single = AxisOneConfig { warps: 3, ..big };
        single.check(Dtype::Bfloat16, false).unwrap();
        assert!(single.check(Dtype::Bfloat16, true).is_err());
        assert!(AxisOneConfig { warps: 4, ..big }.check(Dtype::Bfloat16, false).is_err());
    }
}
