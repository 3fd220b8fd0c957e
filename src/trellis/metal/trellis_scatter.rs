//! The baseline Metal down projection: `kernels/metal/trellis_scatter.metal` (the upstream
//! `trellisScatter` contract), against which the factored and MMA kernels are checked.
//!
//! Weights are f32 `value(state) * scale` with `value = float(y) * TRELLIS_RCP`, multiplied into
//! `x[r]` unfactored. Traversal as [`down_factored_row`](crate::trellis::metal::down_factored::down_factored_row):
//! lane per word of a block, the neighbour word by `simd_shuffle`, [`SPLITS`](crate::trellis::metal::trellis_scatter::SPLITS) input-row splits
//! into f32 partials `[M, SPLITS, C]` that one MLX `sum` folds. One SIMD group serves one
//! activation row, so any `M` runs; both code layouts.

use crate::array::MlxArray;
use crate::error::{invalid, Result};

use super::launch::{apply_and_fold, family_kernel, partials_launch, TRELLIS_SG_PER_TG, TRELLIS_THREADS};
use crate::kernel::sources;
use crate::trellis::checks::{check_operands, int};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

const SOURCE: &str = sources::METAL_TRELLIS_SCATTER;

/// Input-row splits: f32 partial sums per split, folded by one MLX `sum`.
pub const SPLITS: usize = 128;

/// Whether the scatter kernel serves `g`: axis 0, a block of at most 32 words (one SIMD group),
/// either layout.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 0 && (1..=32).contains(&g.words_per_block())
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype, any `M >= 1`, either layout.
pub fn trellis_scatter(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    if !supports(g) {
        invalid!("trellisScatter: needs axis-0 codes with a block of at most 32 words (got {g})");
    }
    let what = "trellisScatter";
    let m = check_operands(what, x2, codes, scales, g)?;
    let kernel = family_kernel("scatter", || SOURCE, &[sources::METAL_CODEBOOK])?;
    let nb = 32 / g.words_per_block();
    let groups = (g.cols / g.t as usize).div_ceil(nb);
    let grid = [TRELLIS_THREADS, groups.div_ceil(TRELLIS_SG_PER_TG), SPLITS * m];
    let cfg = partials_launch(grid, TRELLIS_THREADS, x2, SPLITS, g.cols)
        .template_int("R", int(what, g.rows)?)
        .template_int("C", int(what, g.cols)?)
        .template_int("BT", g.t as i32)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("SG_TG", TRELLIS_SG_PER_TG as i32)
        .template_int("SPLITS", SPLITS as i32)
        .template_int("NP", 32u32.div_ceil(g.k) as i32)
        .template_int("INTERLEAVE", i32::from(g.layout() == CodeLayout::K3Interleaved));
    apply_and_fold(kernel, x2, codes, scales, &cfg)
}
