//! Down projections for any number of activation rows on the simdgroup matrix unit, on Metal:
//! `kernels/metal/down_mma_wide.metal` (the upstream `downMmaWidePass`,
//! `downK3InterleavedMmaWidePass`, `downMmaWide`, `downK3InterleavedMmaWide`).
//!
//! [`down_mma`]'s splits and accumulation (each output row bit for bit the same
//! when R % 8 == 0), with every decoded B fragment feeding an MMA for `MT` blocks of 8 rows; grid
//! z walks chunks of `8 * MT` rows. Code values come from a threadgroup half table of the `2^L`
//! values. A [`DownPass`] (`S` sub-tiles per SIMD group, `MT` blocks) follows the layout and the
//! rows ([`plan`]); neither changes a sum. [`SPLITS`] f32 partials `[M, SPLITS, C]` fold in one MLX
//! `sum`. The upstream timings of these kernels are in `docs/metal-mlp.md`.

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::kernel::MetalKernel;

use super::down_mma::{self, pass_template_ints};
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::checks::check_operands;
use crate::kernel::sources;

use super::launch::{apply_and_fold, family_kernel, partials_launch};

const SOURCE: &str = sources::METAL_DOWN_MMA_WIDE;
/// The bit-window helper (`block_state`) of the wide MMA kernels, shared with
/// [`gate_up_mma`](super::gate_up_mma).
pub(crate) const STATE_HEADER: &str = sources::METAL_DOWN_MMA_WIDE_STATE;

/// SIMD groups per threadgroup (as `downMma`).
const SG_TG: usize = down_mma::SG_TG;
/// Input-row splits: f32 partial sums per split, folded by one MLX `sum` (as `downMma`).
pub const SPLITS: usize = down_mma::SPLITS;

/// One pass of the kernel: `s` sub-tiles (8 positions each) per SIMD group, `mt` blocks of 8
/// activation rows per decoded fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DownPass {
    /// Sub-tiles per SIMD group (the upstream `S`): a SIMD group covers `8 * s` positions.
    pub s: u32,
    /// Blocks of 8 rows per pass (the upstream `MT`).
    pub mt: u32,
}

/// One block of 8 rows per pass, sixteen sub-tiles: the cheapest pass for 1..8 rows in either
/// layout.
pub const DOWN_ONE_BLOCK: DownPass = DownPass { s: 16, mt: 1 };

/// Each layout's passes and their relative cost, measured per pass at 8 to 128 rows: the 3-bit
/// interleave runs one block per pass at every row count; row-major codes take sixteen sub-tiles
/// for one block and eight for two or three.
const INTERLEAVED_PASSES: [(DownPass, f64); 1] = [(DOWN_ONE_BLOCK, 1.0)];
const ROW_MAJOR_PASSES: [(DownPass, f64); 3] =
    [(DOWN_ONE_BLOCK, 0.6), (DownPass { s: 8, mt: 2 }, 1.0), (DownPass { s: 8, mt: 3 }, 1.44)];

/// The passes [`plan`] chooses from for `layout`, each with its relative cost per pass.
pub fn passes(layout: CodeLayout) -> &'static [(DownPass, f64)] {
    match layout {
        CodeLayout::RowMajor => &ROW_MAJOR_PASSES,
        CodeLayout::K3Interleaved => &INTERLEAVED_PASSES,
    }
}

/// The pass for `m` rows: the one whose passes cost least in all, `ceil(m / (8 * mt)) * cost`
/// (the more blocks on a tie).
pub fn plan(layout: CodeLayout, m: usize) -> DownPass {
    plan_in_blocks(layout, m, 256)
}

/// [`plan`] for coded blocks of `t` positions: its choice among the passes whose SIMD group
/// covers a divisor of the block (`8 * s` positions; the costs were measured at 256). Blocks of
/// 192 take eight sub-tiles; where no pass divides the block, one of 8-row blocks with the most
/// sub-tiles that do.
pub fn plan_in_blocks(layout: CodeLayout, m: usize, t: u32) -> DownPass {
    let mut best = (DownPass { s: down_mma::sub_tiles(t) as u32, mt: 1 }, f64::INFINITY);
    for &(pass, cost) in passes(layout).iter().filter(|(pass, _)| t.is_multiple_of(8 * pass.s)) {
        let total = m.div_ceil(8 * pass.mt as usize) as f64 * cost;
        if total <= best.1 {
            best = (pass, total);
        }
    }
    best.0
}

/// Whether these kernels serve `g` (any row count): [`down_mma::supports`]'s geometries (T 256
/// or a shorter multiple of 64, whole blocks per row, L <= 12, either layout) with R % 8 == 0.
pub fn supports(g: &TrellisGeometry) -> bool {
    down_mma::supports(g) && g.rows.is_multiple_of(8)
}

fn launch(
    kernel: &MetalKernel,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    interleave: bool,
    pass: DownPass,
) -> Result<MlxArray> {
    let shape = x2.shape();
    if shape.len() != 2 || shape[0] < 1 {
        invalid!("downMmaWide: expects [rows, inputs]");
    }
    // The callers have checked the layout, so this is the rest of `supports`.
    if !supports(g) {
        invalid!("downMmaWide: unsupported geometry");
    }
    // The seed leaves the pass unchecked; S must tile a coded block into whole groups.
    if ![1, 2, 4, 8, 16, 32].contains(&pass.s) || pass.mt < 1 || pass.mt > 16 || !g.t.is_multiple_of(8 * pass.s) {
        invalid!(
            "downMmaWide: pass {pass:?} needs S in 1, 2, 4, 8, 16, 32 with 8 S dividing the {}-position block, and MT in 1..=16",
            g.t
        );
    }
    let m = check_operands("downMmaWide", x2, codes, scales, g)?;
    let (s, mt) = (pass.s as usize, pass.mt as usize);
    let n_groups = (g.cols / g.t as usize) * (g.t as usize / (8 * s));
    let grid = [32 * SG_TG, (n_groups * SPLITS).div_ceil(SG_TG), m.div_ceil(8 * mt)];
    let cfg =
        pass_template_ints(partials_launch(grid, 32 * SG_TG, x2, SPLITS, g.cols), "downMmaWide", g, interleave, mt, s)?;
    apply_and_fold(kernel, x2, codes, scales, &cfg)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for row-major axis-0 codes (T 256 or a shorter
/// multiple of 64, L at most 12, input features a multiple of 8), any number of rows, in passes
/// of the given shape (the upstream `downMmaWidePass`).
pub fn down_mma_wide_pass(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    pass: DownPass,
) -> Result<MlxArray> {
    if g.block_interleave != 0 || codes.ndim() != 2 {
        invalid!("downMmaWide: needs row-major codes");
    }
    let k = family_kernel("down_mma_wide", || SOURCE, &[sources::METAL_CODEBOOK, STATE_HEADER])?;
    launch(k, x2, codes, scales, g, false, pass)
}

/// [`down_mma_wide_pass`] for 3-bit block-interleaved codes `[cols/512, rows, 48]` (the upstream
/// `downK3InterleavedMmaWidePass`).
pub fn down_k3_interleaved_mma_wide_pass(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    pass: DownPass,
) -> Result<MlxArray> {
    if g.block_interleave != 2 || g.k != 3 {
        invalid!("downK3InterleavedMmaWide: needs 3-bit block-interleaved codes");
    }
    let k = family_kernel("down_k3i_mma_wide", || SOURCE, &[sources::METAL_CODEBOOK, STATE_HEADER])?;
    launch(k, x2, codes, scales, g, true, pass)
}

/// [`down_mma_wide_pass`] in the pass the row count plans (the upstream `downMmaWide`).
pub fn down_mma_wide(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    down_mma_wide_pass(x2, codes, scales, g, plan_in_blocks(CodeLayout::RowMajor, m, g.t))
}

/// [`down_k3_interleaved_mma_wide_pass`] in the pass the row count plans (the upstream
/// `downK3InterleavedMmaWide`).
pub fn down_k3_interleaved_mma_wide(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    down_k3_interleaved_mma_wide_pass(x2, codes, scales, g, plan(CodeLayout::K3Interleaved, m))
}
