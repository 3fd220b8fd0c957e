//! Verify-width down projections (1..8 activation rows) on the simdgroup matrix unit, on Metal:
//! `kernels/metal/down_mma.metal` (the upstream `downMma` / `downK3InterleavedMma`).
//!
//! A SIMD group owns `8 * S` consecutive positions of one coded block (256 positions, or a
//! shorter multiple of 64: template int `BLOCK_LEN`, this crate's in place of the seed's 256) and
//! a split of the input rows; per 8-row step every lane decodes `2S` positions of one input row
//! into the B fragments of `S` output sub-tiles, and the A fragments hold `x * scale * (1/147.8)`.
//! [`SPLITS`] f32 partials `[M, SPLITS, C]` fold in one MLX `sum`. One body, two kernels: row-major
//! codes and the 3-bit block interleave. Not bit-identical to the factored kernels.

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::kernel::{LaunchConfig, MetalKernel};

use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::checks::{check_operands, int};
use crate::kernel::sources;

use super::launch::{apply_and_fold, family_kernel, partials_launch};

const SOURCE: &str = sources::METAL_DOWN_MMA;
const STATE_HEADER: &str = sources::METAL_DOWN_MMA_STATE;

/// SIMD groups per threadgroup.
pub(crate) const SG_TG: usize = 4;
/// Blocks of 8 activation rows per decoded fragment.
const MT: usize = 1;
/// Output sub-tiles (8 positions each) per SIMD group, in 256-position coded blocks.
const S: usize = 16;

/// Output sub-tiles per SIMD group in coded blocks of `t` positions: [`S`], halved until a SIMD
/// group's `8 * S` positions divide the block (192: 8).
pub(crate) fn sub_tiles(t: u32) -> usize {
    let mut s = S;
    while s > 1 && !(t as usize).is_multiple_of(8 * s) {
        s /= 2;
    }
    s
}

/// Input-row splits: f32 partial sums per split, folded by one MLX `sum`.
pub const SPLITS: usize = 8;

/// Whether these kernels serve `g` (for 1..8 rows): axis 0, T 256 or a shorter multiple of 64
/// (SmolLM2's attention in blocks of 192), whole blocks per row, L <= 12, in either layout (the
/// interleave is 3-bit, T 256).
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 0
        && g.t.is_multiple_of(64)
        && (64..=256).contains(&g.t)
        && g.cols.is_multiple_of(g.t as usize)
        && g.l <= 12
        && (g.layout() == CodeLayout::RowMajor || g.k == 3)
}

/// Words covering `2S` positions plus the L-bit window, after realignment.
pub(crate) fn nw(s: usize, g: &TrellisGeometry) -> usize {
    (2 * s * g.k as usize + g.l as usize - 1).div_ceil(32) + 1
}

/// The template ints both MMA families take after their own (`downMma`'s `M`): geometry, splits,
/// threadgroup width, layout and the pass shape (`MT`, `S`, `NW`). `kernel` names errors.
pub(crate) fn pass_template_ints(
    cfg: LaunchConfig,
    kernel: &str,
    g: &TrellisGeometry,
    interleave: bool,
    mt: usize,
    s: usize,
) -> Result<LaunchConfig> {
    Ok(cfg
        .template_int("R", int(kernel, g.rows)?)
        .template_int("C", int(kernel, g.cols)?)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("SPLITS", SPLITS as i32)
        .template_int("SG_TG", SG_TG as i32)
        .template_int("INTERLEAVE", i32::from(interleave))
        .template_int("MT", mt as i32)
        .template_int("S", s as i32)
        .template_int("NW", nw(s, g) as i32)
        .template_int("BLOCK_LEN", g.t as i32))
}

fn launch(
    kernel: &MetalKernel,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    interleave: bool,
) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    if !(1..=8).contains(&m) {
        invalid!("downMma: M={m} outside 1..8");
    }
    // The callers have checked the layout, so this is the rest of `supports`.
    if !supports(g) {
        invalid!("downMma: unsupported geometry");
    }
    check_operands("downMma", x2, codes, scales, g)?;
    let (t, s) = (g.t as usize, sub_tiles(g.t));
    let n_groups = (g.cols / t) * (t / (8 * s));
    let cfg = partials_launch([32 * SG_TG, (n_groups * SPLITS).div_ceil(SG_TG), 1], 32 * SG_TG, x2, SPLITS, g.cols)
        .template_int("M", m as i32);
    let cfg = pass_template_ints(cfg, "downMma", g, interleave, MT, s)?;
    apply_and_fold(kernel, x2, codes, scales, &cfg)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for row-major axis-0 codes (T 256 or a shorter
/// multiple of 64), 1..8 rows (the upstream `downMma`).
pub fn down_mma(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    if g.block_interleave != 0 || codes.ndim() != 2 {
        invalid!("downMma: needs row-major codes");
    }
    let k = family_kernel("down_mma", || SOURCE, &[sources::METAL_CODEBOOK, STATE_HEADER])?;
    launch(k, x2, codes, scales, g, false)
}

/// [`down_mma`] for 3-bit block-interleaved codes `[cols/512, rows, 48]` (the upstream
/// `downK3InterleavedMma`).
pub fn down_k3_interleaved_mma(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    if g.block_interleave != 2 || g.k != 3 {
        invalid!("downK3InterleavedMma: needs 3-bit block-interleaved codes");
    }
    let k = family_kernel("down_k3i_mma", || SOURCE, &[sources::METAL_CODEBOOK, STATE_HEADER])?;
    launch(k, x2, codes, scales, g, true)
}
