//! The plan of the CUDA down kernel: which [`CudaDownConfig`] serves `M` activation rows of a
//! geometry and dtype, and from how many rows the decode-once dense path takes over.

use crate::dtype::Dtype;
use crate::error::{unserved, Result};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

use super::config::{CudaDownConfig, StepUnroll};
use crate::trellis::cuda::serves_block_len;

/// Whether the CUDA kernel serves this geometry: axis 0, T 256 or a shorter block of a multiple
/// of 64 ([`serves_block_len`]: SmolLM2's attention in blocks of 192), L <= 16, k in 2..=4 (the
/// widths it is tested at against the reference; wider codes are refused as unserved) and
/// columns (outputs) of whole coded blocks.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 0
        && serves_block_len(g.t)
        && g.l <= 16
        && (2..=4).contains(&g.k)
        && g.cols.is_multiple_of(g.t as usize)
}

/// An error naming the geometry where [`supports`] says no.
pub(crate) fn require_supported(g: &TrellisGeometry) -> Result<()> {
    if !supports(g) {
        unserved!(
            "CUDA down kernel: unsupported geometry {g} (needs axis 0, T 256 or a multiple of 64 below it, L <= 16, k 2..=4, columns of whole blocks; k 5..8 are untested on this kernel)"
        );
    }
    Ok(())
}

/// The configuration for `m` rows of 16-bit activations: [`plan_for`] with bf16.
#[cfg(any(test, feature = "tuning"))]
pub fn plan(g: &TrellisGeometry, m: usize) -> CudaDownConfig {
    plan_for(g, m, Dtype::Bfloat16)
}

/// The configuration for `m` activation rows of `dtype`, fitted to the geometry. Each choice was
/// measured on an H200 at the Qwen down shape by the kernel's own duration (what a model's chain
/// of dependent layers waits for); docs/cuda-down.md keeps the measurements and the plans they
/// replaced.
pub fn plan_for(g: &TrellisGeometry, m: usize, dtype: Dtype) -> CudaDownConfig {
    // (sub-tiles per warp, 8-row tiles per pass, 16-row chunks per step, coded blocks per thread
    // block, splits, bias fold, IMAD pack, prescaled B tiles on an mbarrier ring, step unroll).
    // Up to 8 rows the decode is everything: 4-warp blocks of narrow tiles hide its latency;
    // at one row the ALU pipe limits it, so half of the code pairs are packed on FMA-heavy
    // (`pack_fma`); the one-row shape also serves 2-4 rows, and NC 4 5-8 (docs/cuda-down.md §5,
    // §9 "2-4 rows"). The steps run in unrolled rounds (fewer instructions a step): of the B
    // tiles' two slots at 1-4 rows, where a round of both rings takes 128 registers, and of both
    // rings at 5-8 rows (§7 lead 6).
    // From 9 rows of 16-bit activations (two 8-row tiles) 8-warp blocks decode each weight once
    // into the registers that multiply it, with the B tiles from the pre-pass kernel streamed
    // into the code ring on mbarriers, so that the warps drift apart and their decode and MMA
    // phases overlap (at 9-16 rows 56 registers against the NC 4 shape's 128: §7 lead 9). A pass
    // holds just the call's rows (MT = M / 8 rounded up); above 64 rows passes of up to 64 share
    // the rows evenly (72 rows: two passes of 40). 13 splits fill whole waves of the GPU.
    // f32 activations keep the B tiles in the block (prescaled residue tiles cost registers), so
    // at 9-16 rows they keep the NC 4 shape that served those rows before.
    let (nc, mt, ks, blocks, splits, bias_fold, pack_fma, prescaled, step_unroll) = match m {
        0..=4 => (8, 1, 1, 2, 64, true, true, false, StepUnroll::BTileSlots),
        5..=8 => (4, 1, 2, 1, 32, true, false, false, StepUnroll::BothRings),
        9..=16 if dtype == Dtype::Float32 => (4, 2, 4, 1, 19, true, false, false, StepUnroll::Rolled),
        // One pass up to 64 rows; above (up to DENSE_MIN_ROWS rows of 16-bit activations, f32
        // ones, and explicit calls) passes of the 64-row shape.
        _ => (2, pass_tiles(m), 4, 1, 13, false, false, true, StepUnroll::Rolled),
    };
    let mut cfg = CudaDownConfig {
        nc,
        mt,
        ks,
        warps: 16 * blocks / nc,
        splits,
        stages: 4,
        // The bias fold takes one HADD2 per pair of weights off the fragments' dp4a decode;
        // the kernel applies it to 16-bit activations only.
        bias_fold,
        pack_fma,
        prescaled: prescaled && dtype != Dtype::Float32,
        mbarriers: prescaled && dtype != Dtype::Float32,
        // Measured with 16-bit activations (f32 ones keep more registers already).
        step_unroll: if dtype == Dtype::Float32 { StepUnroll::Rolled } else { step_unroll },
        direct_codes: false,
    };
    // At 1-4 rows of 16-bit activations in the 3-bit block interleave (the Qwen layout) the code
    // words go straight to registers and the split's B tiles are built once: no ring, no
    // barrier a step (§7 lead 8). Alone 4-5 % faster there, level in the MLP chain; k 2 was
    // level or slower in the chain (four runs), k 4 level alone, and k 3 row-major took 128
    // registers for it (NVRTC 13.5, 96 in the interleave), so those keep the ring.
    if m <= 4 && dtype != Dtype::Float32 && g.layout() == CodeLayout::K3Interleaved {
        cfg.direct_codes = true;
        cfg.step_unroll = StepUnroll::Rolled;
    }
    // Shorter coded blocks (the shapes above were measured at T 256, which they fit as they
    // are): a warp's positions in one coded block (NC 4 or 2 where NC 8's 128 positions do not
    // divide T), and the widest tile of at most the planned warps that covers whole coded blocks
    // or a part of one (T 192: 3 warps of NC 4, or 6 of NC 2, one coded block a thread block).
    while cfg.nc > 2 && !(g.t as usize).is_multiple_of(16 * cfg.nc as usize) {
        cfg.nc /= 2;
    }
    if !cfg.tile_fits(g) {
        cfg.warps = narrower_warps(&cfg, g);
    }
    // Fit the geometry: a block covers a divisor of the coded blocks per row, and wide codes
    // (k >= 5) or f32 activations must still fit the budget: fewer coded blocks per block
    // first, then a shallower ring, shorter steps (rows that are not a multiple of 8 also need a
    // step's rows to divide the block's threads). No more splits than steps.
    while cfg.copied_blocks(g) > 1
        && (!g.blocks_per_row().is_multiple_of(cfg.copied_blocks(g))
            || cfg.shared_bytes(g, dtype == Dtype::Float32) > cfg.plan_shared_budget())
    {
        cfg.warps = narrower_warps(&cfg, g);
    }
    let with_steps = |ks: u32, stages: u32| {
        // The mbarrier ring needs 3 stages; a shallower ring keeps the block barrier.
        let c = CudaDownConfig { ks, stages, mbarriers: cfg.mbarriers && stages >= 3, ..cfg };
        CudaDownConfig { splits: c.splits.min(c.input_steps(g)), ..c }
    };
    std::iter::successors(Some(cfg.ks), |&ks| (ks > 1).then_some(ks / 2))
        .flat_map(|ks| (2..=cfg.stages).rev().map(move |stages| with_steps(ks, stages)))
        .find(|c| c.fits(g, dtype) && c.shared_bytes(g, dtype == Dtype::Float32) <= c.plan_shared_budget())
        // No fit leaves the planned configuration, whose check then names the problem.
        .unwrap_or_else(|| with_steps(cfg.ks, cfg.stages))
}

/// The next narrower thread block for `g`: the most warps below `cfg`'s whose tile fits
/// ([`CudaDownConfig::tile_fits`]). In 256-position coded blocks that is half of them (the
/// planned shapes' tiles are 128 to 512 positions); 192 positions take 3 or 6 warps.
fn narrower_warps(cfg: &CudaDownConfig, g: &TrellisGeometry) -> u32 {
    (1..cfg.warps).rev().find(|&warps| CudaDownConfig { warps, ..*cfg }.tile_fits(g)).unwrap_or(1)
}

/// 8-row MMA tiles a pass for `m` activation rows: passes of up to 8 tiles (64 rows) that share
/// the rows evenly (72 rows: two passes of 5 tiles), in the down and the axis-1 plans alike.
pub(crate) fn pass_tiles(m: usize) -> u32 {
    let tiles = m.div_ceil(8).max(1);
    tiles.div_ceil(tiles.div_ceil(8)) as u32
}

/// Rows of 16-bit activations from which [`down_cuda`](super::down_cuda) decodes the layer
/// to dense weights and runs MLX's matmul instead of the fused kernel: the decode costs one write
/// of the dense layer whatever the row count, while the fused kernel decodes every weight again
/// in each pass of up to 64 rows (the crossover measured on an H200 is in docs/cuda-down.md).
/// The dense path needs `2 * in * out` bytes of scratch per call. f32 activations always take
/// the fused kernel: MLX multiplies f32 in TF32 on CUDA by default, below the f32 accuracy the
/// fused kernel keeps.
pub const DENSE_MIN_ROWS: usize = 129;

/// Whether [`down_cuda`](super::down_cuda) takes the dense path for `m` rows of `dtype` activations.
pub fn uses_dense(m: usize, dtype: Dtype) -> bool {
    m >= DENSE_MIN_ROWS && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::cuda::down::config::{PLAN_SHARED_BUDGET, WIDE_PLAN_SHARED_BUDGET};

    #[test]
    fn every_planned_configuration_is_valid() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let mut geometries = vec![qwen, qwen.interleaved().unwrap()];
        // Every k the plan fits on the Qwen shape (k 5..8, which the kernel does not serve, need
        // the shared-memory fitting), and small shapes whose coded blocks per row shrink the
        // blocks.
        geometries.extend((2..=8).map(|k| TrellisGeometry::row_major(17408, 5120, k, 256, 12, 0).unwrap()));
        let small = [(200, 1024, 3), (88, 512, 4), (16, 256, 2), (17, 768, 2), (40, 768, 8)];
        geometries.extend(small.iter().map(|&(r, c, k)| TrellisGeometry::row_major(r, c, k, 256, 12, 0).unwrap()));
        for g in geometries {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=200 {
                    let cfg = plan_for(&g, m, dtype);
                    cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{g} M {m} {dtype}: {cfg:?}: {e:#}"));
                }
            }
        }
        // The measured plan is unchanged where it fits (k <= 4).
        let one = plan(&qwen, 1);
        assert_eq!((one.warps, one.splits, one.ks, one.pack_fma), (4, 64, 1, true));
        for m in 2..=4 {
            assert_eq!(plan(&qwen, m), one, "{m} rows take the one-row shape");
        }
        let five = plan(&qwen, 5);
        assert_eq!((five.nc, five.warps, five.splits, five.ks, five.pack_fma), (4, 4, 32, 2, false));
        // f32 at 17-32 rows: the fragment decode of 8-warp blocks in one pass, B tiles in the
        // block (it beat the staged decode with producer warps that served those rows).
        let f32_32 = plan_for(&qwen, 32, Dtype::Float32);
        // f32 at 9-16 rows keeps NC 4 in 4-warp blocks (its B tiles stay in the block).
        let f32_16 = plan_for(&qwen, 16, Dtype::Float32);
        assert_eq!((f32_16.nc, f32_16.mt, f32_16.warps, f32_16.splits, f32_16.bias_fold), (4, 2, 4, 19, true));
        assert_eq!((f32_32.nc, f32_32.mt, f32_32.ks, f32_32.warps, f32_32.prescaled), (2, 4, 4, 8, false));
        let wide = plan(&qwen, 64);
        assert_eq!(
            (wide.nc, wide.mt, wide.ks, wide.stages, wide.splits, wide.warps, wide.bias_fold),
            (2, 8, 4, 4, 13, 8, false)
        );
        // Prescaled B tiles on an mbarrier ring from 9 rows of 16-bit activations only, in
        // passes that share the rows evenly above 64.
        for (m, prescaled, mt) in [
            (1, false, 1),
            (4, false, 1),
            (5, false, 1),
            (8, false, 1),
            (9, true, 2),
            (16, true, 2),
            (17, true, 3),
            (32, true, 4),
            (33, true, 5),
            (64, true, 8),
            (72, true, 5),
            (96, true, 6),
            (128, true, 8),
            (200, true, 7),
        ] {
            let cfg = plan(&qwen, m);
            assert_eq!((cfg.prescaled, cfg.mbarriers, cfg.mt), (prescaled, prescaled, mt), "M {m}");
            let f32 = plan_for(&qwen, m, Dtype::Float32);
            assert!(!f32.prescaled && !f32.mbarriers, "M {m} f32");
            // Unrolled steps up to 8 rows of 16-bit activations.
            let unrolled = match m {
                0..=4 => StepUnroll::BTileSlots,
                5..=8 => StepUnroll::BothRings,
                _ => StepUnroll::Rolled,
            };
            assert_eq!(cfg.step_unroll, unrolled, "M {m}");
            assert_eq!(f32.step_unroll, StepUnroll::Rolled, "M {m} f32");
            assert!(!cfg.direct_codes && !f32.direct_codes, "M {m}: k 3 row-major keeps the ring");
        }
        // Direct code loads at 1-4 rows of 16-bit activations for k 3 in the block interleave, in
        // rolled steps; the ring from 5 rows, for f32 and for the other layouts.
        let k2 = TrellisGeometry::row_major(17408, 5120, 2, 256, 8, 0).unwrap();
        let k4 = TrellisGeometry::row_major(17408, 5120, 4, 256, 16, 0).unwrap();
        for g in [qwen.interleaved().unwrap(), k2, k4] {
            for m in 1..=8 {
                for dtype in [Dtype::Float16, Dtype::Bfloat16, Dtype::Float32] {
                    let cfg = plan_for(&g, m, dtype);
                    let direct = m <= 4 && dtype != Dtype::Float32 && g.layout() == CodeLayout::K3Interleaved;
                    assert_eq!(cfg.direct_codes, direct, "{g} M {m} {dtype}");
                    if direct {
                        assert_eq!((cfg.step_unroll, cfg.splits, cfg.warps, cfg.nc), (StepUnroll::Rolled, 64, 4, 8), "{g} M {m}");
                    }
                }
            }
        }
    }
    #[test]
    fn untested_widths_and_ragged_columns_are_unserved_naming_the_rule() {
        let g = TrellisGeometry::row_major(512, 1024, 3, 256, 12, 0).unwrap();
        require_supported(&g).unwrap();
        for k in [5, 8] {
            let wide = TrellisGeometry::row_major(512, 1024, k, 256, 12, 0).unwrap();
            let e = require_supported(&wide).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Unserved);
            assert!(e.to_string().contains("k 2..=4") && e.to_string().contains("untested"), "{e}");
        }
        // The fields are public, so a caller can build columns that are not whole 256-column tiles.
        let ragged = TrellisGeometry { cols: 1000, ..g };
        let e = require_supported(&ragged).unwrap_err().to_string();
        assert!(e.contains("columns of whole blocks"), "{e}");
        // Blocks the kernel does not take: not a multiple of 64, or longer than 256.
        for t in [32, 96, 160, 512] {
            let other = TrellisGeometry::row_major(512, 6 * t as usize, 4, t, 12, 0).unwrap();
            let e = require_supported(&other).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Unserved, "T {t}");
            assert!(e.to_string().contains("T 256 or a multiple of 64 below it"), "T {t}: {e}");
        }
    }

    #[test]
    fn shorter_blocks_are_planned_in_warps_that_stay_inside_one_block() {
        // SmolLM2's attention on axis 0 in blocks of 192 (q and o 576 x 576, k and v 576 -> 192),
        // blocks of 64 and 128, ragged input rows, every k the kernel serves.
        let mut geometries = Vec::new();
        for (rows, cols, t) in [(576, 576, 192), (576, 192, 192), (100, 960, 192), (576, 576, 64), (40, 384, 128), (17, 128, 64)] {
            for k in 2..=4 {
                geometries.push(TrellisGeometry::row_major(rows, cols, k, t, 12, 0).unwrap());
            }
        }
        for g in geometries {
            assert!(supports(&g), "{g}");
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=200 {
                    let cfg = plan_for(&g, m, dtype);
                    cfg.check(&g, dtype).unwrap_or_else(|e| panic!("{g} M {m} {dtype}: {cfg:?}: {e:#}"));
                    assert!(cfg.tile_fits(&g) && !cfg.direct_codes, "{g} M {m} {dtype}: {cfg:?}");
                    assert!(cfg.shared_bytes(&g, dtype == Dtype::Float32) <= cfg.plan_shared_budget(), "{g} M {m}");
                }
            }
        }
        // 192 positions: NC 8's 128 do not divide it, so the one-row shape takes NC 4 in 3 warps
        // (one coded block a thread block); from 9 rows 6 warps of NC 2.
        let q = TrellisGeometry::row_major(576, 576, 3, 192, 12, 0).unwrap();
        let one = plan(&q, 1);
        assert_eq!((one.nc, one.warps, one.copied_blocks(&q), one.column_blocks(&q)), (4, 3, 1, 3));
        let wide = plan(&q, 64);
        assert_eq!((wide.nc, wide.warps, wide.column_blocks(&q)), (2, 6, 3));
        // 64 positions: a row of 9 blocks of 64 takes tiles of 3 whole blocks.
        let g64 = TrellisGeometry::row_major(576, 576, 3, 64, 12, 0).unwrap();
        let one = plan(&g64, 1);
        assert_eq!((one.nc, one.warps, one.copied_blocks(&g64), one.column_blocks(&g64)), (4, 3, 3, 3));
    }

    #[test]
    fn the_plans_fit_their_budgets() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let planned = plan_for(&qwen, 32, Dtype::Float32);
        assert_eq!((planned.ks, planned.stages), (4, 4));
        assert!(planned.shared_bytes(&qwen, true) <= planned.plan_shared_budget());
        // The prescaled 64-row plan: four ring slots of codes and B tiles, and their mbarriers.
        assert_eq!(plan_for(&qwen, 64, Dtype::Bfloat16).shared_bytes(&qwen, false), 65536 + 4 * 16);
        // Fragment plans keep to 48 KB, but for prescaled B tiles in 8-warp
        // blocks (one B tile per ring slot); from 9 rows a pass holds just the call's rows (or
        // an even share of them), without the bias fold, in 64-row steps of 8-warp blocks.
        for (m, mt) in [(1, 1), (8, 1), (16, 2), (17, 3), (32, 4), (33, 5), (48, 6), (64, 8), (72, 5), (128, 8)] {
            let cfg = plan_for(&qwen, m, Dtype::Bfloat16);
            let budget = if cfg.prescaled && cfg.warps >= 8 { WIDE_PLAN_SHARED_BUDGET } else { PLAN_SHARED_BUDGET };
            assert!(cfg.shared_bytes(&qwen, false) <= budget, "{cfg:?}");
            assert_eq!(cfg.mt, mt, "M {m}: {cfg:?}");
            if m > 8 {
                assert_eq!((cfg.nc, cfg.ks, cfg.warps, cfg.bias_fold), (2, 4, 8, false), "M {m}: {cfg:?}");
            }
        }
    }
}
