//! The plan of the CUDA axis-1 kernels: which [`AxisOneConfig`] serves `m` activation rows of a
//! dtype (the kernel and its shape); docs/cuda-mlp.md holds the measurements behind each choice.
//! The configuration itself, its checks and sizes are `config.rs`.

use std::sync::OnceLock;

use crate::device::Device;
use crate::dtype::Dtype;

use super::config::{AxisOneConfig, AxisOneKernel};
use crate::trellis::cuda::down::plan::pass_tiles;

/// Rows of bf16 activations up to which the plan has the fused fragment kernel stage them in
/// shared memory ([`AxisOneConfig::stage`]).
pub const STAGE_MAX_ROWS: usize = 2;

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

impl AxisOneConfig {
    /// The warp-specialized GEMM ([`AxisOneKernel::Specialized`]) for `m` rows of the single
    /// projection or (`fused`) the gate·up·SwiGLU: as few passes of up to 128 rows as hold them,
    /// the rows shared out evenly, `WS_STAGES` stages, [`WS_CTAS`](super::config::WS_CTAS)
    /// thread blocks a pass, the bias fold.
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
