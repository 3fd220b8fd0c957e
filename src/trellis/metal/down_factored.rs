//! Down projections (axis 0) over row-major codes with the input scale factored out, on Metal:
//! `kernels/metal/down_factored.metal` (the upstream `downFactoredRow` / `downFactoredRows`).
//!
//! Each input row's activation is pre-multiplied by `scale * (1/147.8)` and the weights
//! contribute their integer code value `y`. Lane per word of a block, running sums per
//! position, split-K over input rows into [`SPLITS`] f32 partials `[M, SPLITS, C]` that one MLX
//! `sum` folds before the cast to the activation dtype. Same traversal as
//! [`trellis_scatter`](super::trellis_scatter::trellis_scatter), reassociated relative to its f32
//! `value * scale` weights (not bit-identical).

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::kernel::variant::kernel_section;
use crate::kernel::MetalKernel;

use super::launch::{apply_and_fold, family_kernel, partials_launch, TRELLIS_SG_PER_TG, TRELLIS_THREADS};
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::checks::{check_operands, int};
use crate::kernel::sources;

const FILE: &str = sources::METAL_DOWN_FACTORED;

/// Input-row splits: f32 partial sums per split, folded by one MLX `sum`.
pub const SPLITS: usize = 128;

/// Whether the factored kernels serve `g`: axis 0, row-major codes, a block of at most 32 words
/// (one SIMD group).
pub fn supports(g: &TrellisGeometry) -> bool {
    let wpb = g.words_per_block();
    g.axis == 0 && g.layout() == CodeLayout::RowMajor && (1..=32).contains(&wpb)
}

fn launch(
    kernel: &MetalKernel,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    m: usize,
) -> Result<MlxArray> {
    if g.axis != 0 || g.block_interleave != 0 || codes.ndim() != 2 {
        invalid!("downFactored: needs row-major axis-0 codes");
    }
    let wpb = g.words_per_block();
    let nb = 32 / wpb.max(1);
    if nb < 1 {
        invalid!("downFactored: block of {wpb} words exceeds one SIMD group");
    }
    check_operands("downFactored", x2, codes, scales, g)?;
    let groups = (g.cols / g.t as usize).div_ceil(nb);
    let grid = [TRELLIS_THREADS, groups.div_ceil(TRELLIS_SG_PER_TG), SPLITS];
    let cfg = partials_launch(grid, TRELLIS_THREADS, x2, SPLITS, g.cols)
        .template_int("M", int("downFactored", m)?)
        .template_int("R", int("downFactored", g.rows)?)
        .template_int("C", int("downFactored", g.cols)?)
        .template_int("BT", g.t as i32)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("SG_TG", TRELLIS_SG_PER_TG as i32)
        .template_int("SPLITS", SPLITS as i32)
        .template_int("NP", 32u32.div_ceil(g.k) as i32);
    apply_and_fold(kernel, x2, codes, scales, &cfg)
}

/// `x2 [1, in] · W -> [1, out]` in `x2`'s dtype (the upstream `downFactoredRow`).
pub fn down_factored_row(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    if x2.shape().first() != Some(&1) {
        invalid!("downFactoredRow: expects one activation row");
    }
    let k = family_kernel("down_factored_row", || kernel_section(FILE, "ROW"), &[sources::METAL_CODEBOOK])?;
    launch(k, x2, codes, scales, g, 1)
}

/// `x2 [M, in] · W -> [M, out]` for 2..4 rows sharing each decoded weight (the upstream
/// `downFactoredRows`).
pub fn down_factored_rows(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    if !(2..=4).contains(&m) {
        invalid!("downFactoredRows: M={m} outside 2..4");
    }
    let k = family_kernel("down_factored_rows", || kernel_section(FILE, "ROWS"), &[sources::METAL_CODEBOOK])?;
    launch(k, x2, codes, scales, g, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_split_the_family_file() {
        let row = kernel_section(FILE, "ROW");
        let rows = kernel_section(FILE, "ROWS");
        assert!(row.starts_with("  const uint lane") && rows.starts_with("  const uint lane"));
        assert!(!row.contains("---- kernel") && !rows.contains("---- kernel"));
        assert!(row.contains("float acc[NP];") && rows.contains("float acc[M][NP];"));
    }
}
