//! [`AxisOneConfig`]: which CUDA axis-1 kernel one call runs ([`AxisOneKernel`]: `gate_up.cu`,
//! `gate_up_int8.cu`, `gate_up_gemm.cu`, `gate_up_wgmma.cu` or `gate_up_ws.cu` under
//! `kernels/cuda/`) and how it is shaped, its checks, and the plan that picks them for a row
//! count.

use std::sync::OnceLock;

use crate::device::Device;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};

use crate::trellis::cuda::down::plan::pass_tiles;

/// The static shared memory a thread block may take (the warps' sums for warp 0 to add).
const STATIC_SHARED_LIMIT: usize = 48 * 1024;

/// The most activation rows the int8 kernel takes (its template int `R`: the MMA's 8 columns).
pub const INT8_MAX_ROWS: usize = 8;

/// The dynamic shared memory a thread block may take on the GPUs MLX's CUDA back-end serves
/// (227 KB on sm_90; MLX raises a kernel's limit above 48 KB).
const DYNAMIC_SHARED_LIMIT: usize = 227 * 1024;

/// Rows of bf16 activations up to which the plan has the fused fragment kernel stage them in
/// shared memory ([`AxisOneConfig::stage`]).
pub const STAGE_MAX_ROWS: usize = 2;

/// The most shared memory the staged rows may take: with the kernel's own 5–7 KB, a thread block
/// stays within the 45 KB that leaves an SM the five blocks its registers allow (96 a thread).
const STAGE_MAX_BYTES: usize = 38 * 1024;

/// Rows of 16-bit activations from which the plan takes the decode-once GEMM
/// ([`AxisOneKernel::Gemm`]) instead of the fragment kernel for one projection.
pub const GEMM_MIN_ROWS: usize = 9;

/// [`GEMM_MIN_ROWS`] of the fused gate·up·SwiGLU: from 3 rows the GEMM (one 8-row tile a warp,
/// two warps a tile) is faster than the fragment kernel in Qwen3-14B's MLP chain on an H200; at
/// 2 rows the fragment kernel's staged rows stay ahead (docs/cuda-mlp.md, "The GEMM from 3
/// rows").
pub const GEMM_FUSED_MIN_ROWS: usize = 3;

/// Thread blocks the GEMM's grid should have at least: two on each of an H200's 132 SMs. The
/// plan gives a block fewer output tiles (warps) until a layer's grid has them.
const GEMM_FILL_BLOCKS: usize = 2 * 132;

/// The fused GEMM's warps (16-row output tiles) a thread block in the plan, which also leaves out
/// the code-word prefetch. Three, not four: four tiles a block with the prefetch left Qwen3-14B's
/// gate·up a last partial wave in which the SMs mostly idled (docs/cuda-mlp.md, "Waves in the
/// chain"); the registers and occupancy of three are measured in "Occupancy, measured". The
/// single projection's GEMM keeps four warps and the prefetch (not measured in a chain).
const GEMM_FUSED_WARPS: u32 = 3;

/// The fused GEMM's warps a tile (`split_k`) in passes of up to [`GEMM_SPLIT_MAX_TILES`] 8-row
/// tiles, where a layer's tiles alone leave the GPU half empty. Two warps a tile (six a block)
/// were faster in the MLP chain at 16 and 32 rows; four were no faster than two
/// (docs/cuda-mlp.md, "Where the warps wait, and split-K").
const GEMM_SPLIT_K: u32 = 2;

/// The most 8-row tiles a pass of the fused GEMM splits its warps over the inputs at. At 64-row
/// passes a split block runs one to an SM, the same warps as two unsplit ones, and was slower in
/// the chain (docs/cuda-mlp.md, "Where the warps wait, and split-K").
const GEMM_SPLIT_MAX_TILES: u32 = 4;

/// Whether the plan's GEMM carries y + 1534 in its fragments and subtracts each row's bias at the
/// end ([`AxisOneConfig::bias_fold`]): one HSUB2 fewer a pair of weights.
const GEMM_BIAS_FOLD: bool = true;

/// Rows of 16-bit activations from which the plan takes the warp-specialized GEMM
/// ([`AxisOneKernel::Specialized`]) for the fused gate·up·SwiGLU on GPUs with Hopper's warpgroup
/// MMA, up to [`WS_FUSED_MAX_ROWS`] (one pass; no dense path). In Qwen3-14B's MLP chain on an
/// H200 it was faster than the GEMM at 64 rows and than the dense path at 96 and 128, and level
/// with the GEMM at 48 (docs/cuda-mlp.md, "Where it waited, and the activations by bulk copy").
pub const WS_FUSED_MIN_ROWS: usize = 49;

/// The most rows the plan gives the warp-specialized GEMM: one pass. Above it the dense path
/// decodes once a call where the kernel would decode once a pass (not measured).
pub const WS_FUSED_MAX_ROWS: usize = 128;

/// Steps of 64 inputs in the warp-specialized GEMM's ring in the plan: 6 were faster than 4 in
/// Qwen3-14B's MLP chain on an H200 (docs/cuda-mlp.md, "The warp-specialized GEMM").
const WS_STAGES: u32 = 6;

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
    const fn plain_of(kernel: AxisOneKernel) -> AxisOneConfig {
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

    /// The warp-specialized GEMM ([`AxisOneKernel::Specialized`]) for `m` rows of the single
    /// projection or (`fused`) the gate·up·SwiGLU: as few passes of up to 128 rows as hold them,
    /// the rows shared out evenly, `WS_STAGES` stages, [`WS_CTAS`] thread blocks a pass, the
    /// bias fold.
    pub fn specialized(m: usize, fused: bool) -> AxisOneConfig {
        let passes = m.div_ceil(128).max(1);
        AxisOneConfig {
            mt: m.div_ceil(passes).div_ceil(8).clamp(1, 16) as u32,
            warps: if fused { 12 } else { 8 },
            bias_fold: true,
            stages: WS_STAGES,
            ..AxisOneConfig::plain_of(AxisOneKernel::Specialized)
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
        if self.split_k != 1 && (self.kernel != AxisOneKernel::Gemm || !(1..=4).contains(&self.split_k) || self.warps % self.split_k != 0) {
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
                || self.warps % self.row_split != 0)
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

/// The kernel and shape for `m` rows of `dtype` activations of a layer of `outputs` rows
/// (`fused`: the gate·up·SwiGLU kernel, which holds two accumulator sets and so takes one row tile
/// a block); docs/cuda-mlp.md says how the work is split and holds the kernels' measurements. The
/// GEMM from [`GEMM_MIN_ROWS`] rows of 16-bit activations, fused from [`GEMM_FUSED_MIN_ROWS`] (4
/// output tiles a block with the code-word prefetch, the fused one 3 without it and, up to 32 rows
/// a pass, two warps a tile; fewer tiles where a layer's grid would not fill the GPU), on GPUs
/// with Hopper's warpgroup MMA the warp-specialized GEMM for the fused kernel at
/// [`WS_FUSED_MIN_ROWS`]–[`WS_FUSED_MAX_ROWS`] rows ([`plan_on`]), the fragment kernel otherwise
/// (never the int8 one: it measured no faster at one row).
pub fn plan(m: usize, dtype: Dtype, fused: bool, outputs: usize) -> AxisOneConfig {
    plan_on(m, dtype, fused, outputs, warpgroup_mma())
}

/// Whether MLX's default GPU runs Hopper's warpgroup MMA (`wgmma`, sm_90a: compute capability
/// 9.0 exactly; later GPUs have other MMAs), asked once.
pub fn warpgroup_mma() -> bool {
    static HOPPER: OnceLock<bool> = OnceLock::new();
    *HOPPER.get_or_init(|| Device::gpu().cuda_compute_capability() == Some((9, 0)))
}

/// [`plan`] on a GPU with (`wgmma`) or without Hopper's warpgroup MMA: from
/// [`WS_FUSED_MIN_ROWS`] to [`WS_FUSED_MAX_ROWS`] rows of 16-bit activations with it, the fused
/// gate·up·SwiGLU takes the warp-specialized GEMM ([`AxisOneConfig::specialized`]).
pub fn plan_on(m: usize, dtype: Dtype, fused: bool, outputs: usize, wgmma: bool) -> AxisOneConfig {
    let mt = pass_tiles(m);
    let sixteen_bit = dtype != Dtype::Float32;
    if wgmma && fused && sixteen_bit && (WS_FUSED_MIN_ROWS..=WS_FUSED_MAX_ROWS).contains(&m) {
        return AxisOneConfig::specialized(m, true);
    }
    let gemm_min_rows = if fused { GEMM_FUSED_MIN_ROWS } else { GEMM_MIN_ROWS };
    if sixteen_bit && m >= gemm_min_rows {
        let passes = m.div_ceil(8 * mt as usize);
        let blocks = |warps: usize| outputs.div_ceil(16 * warps).saturating_mul(passes);
        let (most, prefetch) = if fused { (GEMM_FUSED_WARPS, false) } else { (4, true) };
        let tiles = [most, 2].into_iter().find(|&w| blocks(w as usize) >= GEMM_FILL_BLOCKS).unwrap_or(1);
        let split_k = if fused && mt <= GEMM_SPLIT_MAX_TILES { GEMM_SPLIT_K } else { 1 };
        return AxisOneConfig {
            mt,
            rt: 1,
            warps: tiles * split_k,
            bias_fold: GEMM_BIAS_FOLD,
            pack_fma: false,
            kernel: AxisOneKernel::Gemm,
            prefetch,
            split_k,
            // No row split: it measured slower in the MLP chain at 64 and 128 rows
            // (docs/cuda-mlp.md).
            row_split: 1,
            stage: false,
            // The warp-specialized GEMM's own fields, unread here.
            ..AxisOneConfig::plain_of(AxisOneKernel::Gemm)
        };
    }
    AxisOneConfig {
        mt,
        rt: if fused || mt > 2 { 1 } else { 2 },
        warps: 4,
        bias_fold: sixteen_bit && mt <= 2,
        pack_fma: sixteen_bit && m == 1,
        kernel: AxisOneKernel::Fragment,
        prefetch: false,
        split_k: 1,
        row_split: 1,
        // Measured for the fused kernel with bf16 activations, which it also converts: the
        // single projection's two row tiles took 107 registers with it (96 without), and f16's
        // fused kernel 119 (101), unmeasured (docs/cuda-mlp.md).
        stage: fused && dtype == Dtype::Bfloat16 && m <= STAGE_MAX_ROWS,
        ..AxisOneConfig::plain_of(AxisOneKernel::Fragment)
    }
}

/// 8-row tiles a warp (`mt`) for `m` rows in passes of `row_split` warps a tile of up to 8 tiles
/// each, as few passes as that allows, the tiles shared out as evenly as they go: the down plan's
/// `pass_tiles` of each warp's share of the rows (a ceiling of a ceiling is the ceiling of the
/// whole). For the sweeps of row-split shapes (the plan takes none).
#[cfg(any(test, feature = "tuning"))]
pub fn split_pass_tiles(m: usize, row_split: u32) -> u32 {
    pass_tiles(m.div_ceil(row_split.max(1) as usize))
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
    fn every_planned_shape_is_valid_and_passes_share_the_rows() {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for fused in [false, true] {
                for m in 1..=300 {
                    let cfg = plan(m, dtype, fused, 17408);
                    cfg.check(dtype, fused).unwrap_or_else(|e| panic!("M {m} {dtype}: {e}"));
                    let passes = m.div_ceil(cfg.pass_rows());
                    // Passes of up to 64 rows, as few as that allows, whose tiles exceed the
                    // call's 8-row tiles by less than one per pass; no row split.
                    assert_eq!(passes, m.div_ceil(64), "M {m}: {cfg:?}");
                    assert!((cfg.mt as usize) * passes < m.div_ceil(8) + passes, "M {m}: {cfg:?}");
                    assert_eq!(cfg.row_split, 1, "M {m}: {cfg:?}");
                }
            }
        }
        assert_eq!(plan(72, Dtype::Bfloat16, true, 17408).mt, 5);
        assert!(plan(1, Dtype::Bfloat16, false, 17408).pack_fma && !plan(1, Dtype::Float32, false, 17408).bias_fold);
        assert!((1..=300).all(|m| plan(m, Dtype::Bfloat16, true, 17408).kernel != AxisOneKernel::Int8));
    }

    #[test]
    fn the_gemm_takes_sixteen_bit_rows_from_its_threshold() {
        for fused in [false, true] {
            for m in 1..=300 {
                for dtype in [Dtype::Float16, Dtype::Bfloat16] {
                    let gemm = plan(m, dtype, fused, 17408).kernel == AxisOneKernel::Gemm;
                    let from = if fused { GEMM_FUSED_MIN_ROWS } else { GEMM_MIN_ROWS };
                    assert_eq!(gemm, m >= from, "M {m} {dtype} fused {fused}");
                }
                assert_eq!(plan(m, Dtype::Float32, fused, 17408).kernel, AxisOneKernel::Fragment, "M {m} f32");
            }
        }
        // Qwen3-14B's gate and up: three output tiles a block fused (no prefetch), two warps a
        // tile up to 32 rows a pass; four tiles alone, unsplit; SmolLM2's 576-row down
        // projection: one (36 blocks a pass), and two from 16 passes (288 blocks at 2 warps).
        for (m, warps, split_k) in [(9, 6, 2), (32, 6, 2), (33, 3, 1), (64, 3, 1), (128, 3, 1)] {
            let gemm = plan(m, Dtype::Bfloat16, true, 17408);
            assert_eq!((gemm.warps, gemm.split_k), (warps, split_k), "M {m}");
            assert!(!gemm.prefetch);
            gemm.check(Dtype::Bfloat16, true).unwrap();
        }
        let alone = plan(32, Dtype::Bfloat16, false, 17408);
        assert_eq!((alone.warps, alone.split_k), (4, 1));
        assert!(alone.prefetch);
        assert_eq!(plan(32, Dtype::Bfloat16, false, 576).warps, 1);
        assert_eq!(plan(512, Dtype::Bfloat16, false, 576).warps, 1);
        assert_eq!(plan(1024, Dtype::Bfloat16, false, 576).warps, 2);
        // Two stages of 64 rows of 288 halves, and 64 row factors and 64 row biases.
        let gemm = plan(64, Dtype::Bfloat16, false, 17408);
        assert_eq!(gemm.gemm_shared_bytes(false), 2 * 64 * 576 + 512);
        assert_eq!(AxisOneConfig { mt: 1, ..gemm }.gemm_shared_bytes(true), 2 * 8 * 576 + 64);
    }

    #[test]
    fn gemm_shapes_outside_its_kernel_are_errors_that_say_so() {
        let gemm = plan(64, Dtype::Bfloat16, false, 17408);
        gemm.check(Dtype::Float16, true).unwrap();
        let err = AxisOneConfig { bias_fold: false, ..gemm }.check(Dtype::Float32, false).unwrap_err().to_string();
        assert!(err.contains("GEMM: for 16-bit activations (got float32)"), "{err}");
        let err = AxisOneConfig { bias_fold: true, ..gemm }.check(Dtype::Float32, false).unwrap_err().to_string();
        assert!(err.contains("bias fold is for 16-bit activations"), "{err}");
        for bad in [
            AxisOneConfig { rt: 2, ..gemm },
            AxisOneConfig { bias_fold: true, pack_fma: true, ..gemm },
        ] {
            let err = bad.check(Dtype::Bfloat16, false).unwrap_err().to_string();
            assert!(err.contains("GEMM: rt = 1"), "{bad:?}: {err}");
        }
        AxisOneConfig { prefetch: false, ..gemm }.check(Dtype::Bfloat16, true).unwrap();
        AxisOneConfig { bias_fold: !gemm.bias_fold, ..gemm }.check(Dtype::Float16, true).unwrap();
        for kernel in [AxisOneKernel::Fragment, AxisOneKernel::Int8] {
            let bad = AxisOneConfig { prefetch: true, ..AxisOneConfig::plain(kernel) };
            let err = bad.check(Dtype::Bfloat16, true).unwrap_err().to_string();
            assert!(err.contains("prefetch is the GEMM's"), "{bad:?}: {err}");
        }
    }

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
    fn staged_rows_are_planned_at_one_and_two_rows_where_they_fit() {
        for m in 1..=300 {
            assert_eq!(plan(m, Dtype::Bfloat16, true, 17408).stage, m <= STAGE_MAX_ROWS, "M {m}");
            for (dtype, fused) in [(Dtype::Float32, true), (Dtype::Float16, true), (Dtype::Bfloat16, false)] {
                assert!(!plan(m, dtype, fused, 17408).stage, "M {m} {dtype} fused {fused}");
            }
        }
        let staged = plan(2, Dtype::Bfloat16, true, 17408);
        // Qwen3-14B's 5120 inputs: 5120 + 640 + 32 halves a row.
        assert_eq!(staged.stage_shared_bytes(1, 5120), Some(5792 * 2));
        assert_eq!(staged.stage_shared_bytes(2, 5120), Some(2 * 5792 * 2));
        // A pass holds at most 8 mt rows; wider rows than fit are read from global memory.
        assert_eq!(staged.stage_shared_bytes(100, 768), Some(8 * 896 * 2));
        assert_eq!(staged.stage_shared_bytes(2, 28672), None);
        assert_eq!(staged.stage_shared_bytes(usize::MAX, usize::MAX), None);
        assert_eq!(plan(3, Dtype::Bfloat16, true, 17408).stage_shared_bytes(3, 5120), Some(0));
        // Staging is the fragment kernel's, for 16-bit activations.
        assert!(AxisOneConfig { stage: true, ..staged }.check(Dtype::Float32, false).is_err());
        let gemm = AxisOneConfig { stage: true, ..AxisOneConfig::plain(AxisOneKernel::Gemm) };
        assert!(gemm.check(Dtype::Bfloat16, false).unwrap_err().to_string().contains("stage is the fragment kernel's"));
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
    fn row_split_is_the_gemms_without_split_k_and_divides_its_warps() {
        let gemm = AxisOneConfig { mt: 8, warps: 6, row_split: 2, ..AxisOneConfig::plain(AxisOneKernel::Gemm) };
        gemm.check(Dtype::Bfloat16, true).unwrap();
        assert_eq!(gemm.pass_rows(), 128);
        // Two stages of 128 rows, their factors and biases, and three tiles' two buffers of two
        // chunks of two matrices (one alone) of 512 bytes.
        assert_eq!(gemm.gemm_shared_bytes(true), 2 * 128 * 576 + 2 * 128 * 4 + 3 * 2 * 2 * 2 * 512);
        assert_eq!(gemm.gemm_shared_bytes(false), 2 * 128 * 576 + 2 * 128 * 4 + 3 * 2 * 2 * 512);
        // Four warps a tile step four chunks at a time; sixteen warps a block are the GEMM's most.
        let four = AxisOneConfig { mt: 4, warps: 16, row_split: 4, ..gemm };
        four.check(Dtype::Float16, false).unwrap();
        assert_eq!(four.gemm_shared_bytes(true), 2 * 128 * 576 + 2 * 128 * 4 + 4 * 2 * 4 * 2 * 512);
        for bad in [
            AxisOneConfig { row_split: 3, warps: 6, ..gemm },
            AxisOneConfig { row_split: 0, ..gemm },
            AxisOneConfig { row_split: 4, ..gemm },
            AxisOneConfig { split_k: 2, warps: 4, ..gemm },
            AxisOneConfig { kernel: AxisOneKernel::Fragment, warps: 4, ..gemm },
            AxisOneConfig { kernel: AxisOneKernel::Wgmma, warps: 4, ..gemm },
        ] {
            let err = bad.check(Dtype::Bfloat16, true).unwrap_err().to_string();
            assert!(err.contains("row_split"), "{bad:?}: {err}");
        }
        let err = AxisOneConfig { warps: 18, ..gemm }.check(Dtype::Bfloat16, true).unwrap_err().to_string();
        assert!(err.contains("warps = 18 (1..=16 for the Gemm kernel)"), "{err}");
        let err = AxisOneConfig { warps: 12, ..AxisOneConfig::plain(AxisOneKernel::Fragment) }.check(Dtype::Bfloat16, true);
        assert!(err.unwrap_err().to_string().contains("(1..=8 for the Fragment kernel)"));
        // Row split tiles: 33..=128 rows in one pass of two warps' tiles, shared out evenly.
        assert_eq!([33, 64, 65, 128, 129, 200].map(|m| split_pass_tiles(m, 2)), [3, 4, 5, 8, 5, 7]);
        assert_eq!([1, 8, 9, 64, 65].map(|m| split_pass_tiles(m, 1)), [1, 1, 2, 8, 5]);
    }

    #[test]
    fn too_much_static_shared_memory_is_an_error_that_says_so() {
        // 7 warps' sums of 2 matrices x 4 row tiles x 8 tiles (256 a lane) and the bias (32).
        let big = AxisOneConfig {
            mt: 8,
            rt: 4,
            warps: 8,
            bias_fold: true,
            pack_fma: false,
            kernel: AxisOneKernel::Fragment,
            prefetch: false,
            split_k: 1,
            row_split: 1,
            stage: false,
            ..AxisOneConfig::plain(AxisOneKernel::Fragment)
        };
        let err = big.check(Dtype::Bfloat16, true).unwrap_err().to_string();
        assert!(err.contains("258560 bytes of static shared memory") && err.contains("at most 49152"), "{err}");
        // The single projection holds one set (160 sums a lane): 3 warps (two warps' sums) fit,
        // 4 do not.
        let single = AxisOneConfig { warps: 3, ..big };
        single.check(Dtype::Bfloat16, false).unwrap();
        assert!(single.check(Dtype::Bfloat16, true).is_err());
        assert!(AxisOneConfig { warps: 4, ..big }.check(Dtype::Bfloat16, false).is_err());
    }

    #[test]
    fn the_warp_specialized_gemm_is_planned_in_its_rows_on_hopper_only() {
        for m in [WS_FUSED_MIN_ROWS, 96, WS_FUSED_MAX_ROWS] {
            for dtype in [Dtype::Bfloat16, Dtype::Float16] {
                let cfg = plan_on(m, dtype, true, 17408, true);
                assert_eq!(cfg, AxisOneConfig::specialized(m, true), "{m} {dtype}");
                cfg.check(dtype, true).unwrap();
                // Without the warpgroup MMA, and for the single projection or f32, as before.
                assert_ne!(plan_on(m, dtype, true, 17408, false).kernel, AxisOneKernel::Specialized);
                assert_ne!(plan_on(m, dtype, false, 17408, true).kernel, AxisOneKernel::Specialized);
            }
            assert_ne!(plan_on(m, Dtype::Float32, true, 17408, true).kernel, AxisOneKernel::Specialized);
        }
        for m in [1, WS_FUSED_MIN_ROWS - 1, WS_FUSED_MAX_ROWS + 1, 4096] {
            let outside = plan_on(m, Dtype::Bfloat16, true, 17408, true);
            assert_eq!(outside, plan_on(m, Dtype::Bfloat16, true, 17408, false), "{m}");
        }
    }

    #[test]
    fn warp_specialized_passes_hold_up_to_128_rows_shared_out_evenly() {
        // (rows, 8-row tiles a pass): one pass up to 128 rows, then as few as hold them.
        for (m, mt) in [(1, 1), (33, 5), (64, 8), (65, 9), (128, 16), (129, 9), (200, 13), (256, 16), (257, 11)] {
            let cfg = AxisOneConfig::specialized(m, true);
            assert_eq!(cfg.mt, mt, "{m}");
            assert!(m.div_ceil(cfg.pass_rows()) == m.div_ceil(128), "{m}: as few passes as hold the rows");
            assert_eq!((cfg.warps, AxisOneConfig::specialized(m, false).warps), (12, 8));
        }
        // The stages of two matrices' 64 rows and 128 activation rows of 64 inputs, the rows'
        // factors and biases, the stages' mbarriers, the flag.
        let cfg = AxisOneConfig { stages: 4, ..AxisOneConfig::specialized(128, true) };
        assert_eq!(cfg.ws_shared_bytes(true), 4 * (2 * 8192 + 128 * 128) + 2 * 128 * 4 + 4 * 8 + 16);
        assert_eq!(cfg.ws_shared_bytes(false), 4 * (8192 + 128 * 128) + 2 * 128 * 4 + 4 * 8 + 16);
        assert_eq!(AxisOneConfig::specialized(128, true).stages, WS_STAGES);
    }

    #[test]
    fn warp_specialized_shapes_outside_its_kernel_are_errors_that_say_so() {
        let fused = AxisOneConfig::specialized(128, true);
        let cases: [(AxisOneConfig, bool, Dtype, &str); 7] = [
            (AxisOneConfig { warps: 8, ..fused }, true, Dtype::Bfloat16, "warps = 12"),
            (fused, false, Dtype::Bfloat16, "warps = 8"),
            (AxisOneConfig { rt: 2, ..fused }, true, Dtype::Bfloat16, "rt = 1"),
            (AxisOneConfig { stages: 3, ..fused }, true, Dtype::Bfloat16, "stages = 3 (4..=7)"),
            (AxisOneConfig { ctas: 0, ..fused }, true, Dtype::Bfloat16, "ctas = 0"),
            (AxisOneConfig { mt: 17, ..fused }, true, Dtype::Bfloat16, "mt = 17 (1..=16)"),
            (AxisOneConfig { bias_fold: false, ..fused }, true, Dtype::Float32, "f32 keeps the fragment kernel"),
        ];
        for (cfg, fused, dtype, says) in cases {
            let err = cfg.check(dtype, fused).unwrap_err().to_string();
            assert!(err.contains(says), "{cfg:?}: {err}");
        }
        // The most stages of the most rows fit in a block's shared memory (225 KB).
        AxisOneConfig { stages: 7, ..fused }.check(Dtype::Float16, true).unwrap();
    }
}
