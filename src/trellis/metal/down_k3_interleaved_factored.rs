//! Down projections (axis 0) over 3-bit codes in the block-interleaved layout
//! `[cols/512, rows, 48]` (T 256, L 12) with the input scale factored out, on Metal:
//! `kernels/metal/down_k3_interleaved_factored.metal` (the upstream
//! `downK3InterleavedFactoredRow` / `downK3InterleavedFactoredRows`).
//!
//! One block per SIMD group, every lane owning 8 consecutive positions (24 bits), so all 32
//! lanes are busy. Split-K over input rows into [`SPLITS`] f32 partials folded by one MLX `sum`,
//! then cast to the activation dtype.

use crate::array::MlxArray;
use crate::error::{invalid, Result};
use crate::kernel::variant::kernel_section;
use crate::kernel::MetalKernel;

use super::launch::{apply_and_fold, family_kernel, partials_launch, TRELLIS_SG_PER_TG, TRELLIS_THREADS};
use crate::trellis::format::TrellisGeometry;
use crate::trellis::checks::{check_operands, int};
use crate::kernel::sources;

const FILE: &str = sources::METAL_DOWN_K3_INTERLEAVED_FACTORED;

/// Input-row splits: f32 partial sums per split, folded by one MLX `sum`.
pub const SPLITS: usize = 128;

/// The layout's constants (baked into the kernel text as literals).
const K: u32 = 3;
const BT: u32 = 256;
const L: u32 = 12;

/// Whether these kernels serve `g`: 3-bit block-interleaved axis-0 codes, T 256, L 12.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 0 && g.block_interleave == 2 && g.k == K && g.t == BT && g.l == L
}

fn launch(
    kernel: &MetalKernel,
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    m: usize,
) -> Result<MlxArray> {
    let what = "downK3InterleavedFactored";
    if !supports(g) {
        invalid!("{what}: needs 3-bit block-interleaved axis-0 codes (T 256, L 12)");
    }
    check_operands(what, x2, codes, scales, g)?;
    let grid = [TRELLIS_THREADS, (g.cols / BT as usize).div_ceil(TRELLIS_SG_PER_TG), SPLITS];
    let cfg = partials_launch(grid, TRELLIS_THREADS, x2, SPLITS, g.cols)
        .template_int("M", int(what, m)?)
        .template_int("R", int(what, g.rows)?)
        .template_int("C", int(what, g.cols)?)
        .template_int("SG_TG", TRELLIS_SG_PER_TG as i32)
        .template_int("SPLITS", SPLITS as i32);
    apply_and_fold(kernel, x2, codes, scales, &cfg)
}

/// `x2 [1, in] · W -> [1, out]` in `x2`'s dtype (the upstream `downK3InterleavedFactoredRow`).
pub fn down_k3_interleaved_factored_row(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    if x2.shape().first() != Some(&1) {
        invalid!("downK3InterleavedFactoredRow: expects one activation row");
    }
    let k = family_kernel("down_k3i_factored_row", || kernel_section(FILE, "ROW"), &[sources::METAL_CODEBOOK])?;
    launch(k, x2, codes, scales, g, 1)
}

/// `x2 [M, in] · W -> [M, out]` for 2..4 rows sharing each decoded weight (the upstream
/// `downK3InterleavedFactoredRows`).
pub fn down_k3_interleaved_factored_rows(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    if !(2..=4).contains(&m) {
        invalid!("downK3InterleavedFactoredRows: M={m} outside 2..4");
    }
    let k = family_kernel("down_k3i_factored_rows", || kernel_section(FILE, "ROWS"), &[sources::METAL_CODEBOOK])?;
    launch(k, x2, codes, scales, g, m)
}
