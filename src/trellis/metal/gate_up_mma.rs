//! Gate/up projections (axis 1) and the fused gate·up·SwiGLU for any number of activation rows
//! on the simdgroup matrix unit, on Metal: `kernels/metal/gate_up_mma.metal` (a new family in
//! the style of the upstream wide MMA kernel, `down_mma_wide`).
//!
//! The product is taken transposed, `outᵀ [R, M] = W [R, C] · xᵀ [C, M]`, so that a lane's A
//! fragment holds one output row's weights at 16 contiguous positions of a 64-position chunk
//! (one realigned bit window per row and chunk); code values come from a threadgroup half table
//! of the `2^L` values. A SIMD group owns `nt` tiles of 8 output rows and `mt` blocks of 8
//! activation rows per pass ([`UpPass`], planned by [`plan`]); grid z walks the passes. The scale
//! and `1/147.8` are folded in once per output and the output is written in the activation dtype:
//! no partials, no MLX fold. Two variants: one projection, and the fused
//! `silu(x · Wg) ⊙ (x · Wu)` that reads both code tensors for the same output rows.

use crate::array::MlxArray;
use crate::error::{invalid, unserved, ErrorContext, Result};
use crate::kernel::variant::source_variant;
use crate::kernel::MetalKernel;

use super::down_mma_wide::STATE_HEADER;
use super::launch::{registered_kernel, TRELLIS_SG_PER_TG, TRELLIS_THREADS};
use super::gate_up_factored::{self, apply, arg_names, axis_one_launch, check_layers, key, GATE_UP_HEADER};
use crate::trellis::format::TrellisGeometry;
use crate::kernel::sources;

const SOURCE: &str = sources::METAL_GATE_UP_MMA;

/// One pass of the kernel: `nt` tiles of 8 output rows per SIMD group, `mt` blocks of 8
/// activation rows per pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpPass {
    /// Tiles of 8 output rows per SIMD group: each B fragment (activations) feeds one MMA per tile.
    pub nt: u32,
    /// Blocks of 8 activation rows per pass: each decoded A fragment feeds one MMA per block.
    pub mt: u32,
}

/// The most blocks of 8 activation rows [`plan`] puts in one pass (accumulators: `2 * nt * mt`
/// floats per lane and projection).
pub const MAX_MT: u32 = 4;

/// The pass for `m` rows: two output tiles per SIMD group for one projection, one for the fused
/// kernel (the same decoded rows per step), and the rows' blocks of 8 shared evenly over the
/// fewest passes of at most [`MAX_MT`] blocks (every weight is decoded once per pass). Not
/// measured: the upstream M1 Max figures are for the down kernels only.
pub fn plan(m: usize, swiglu: bool) -> UpPass {
    let blocks = m.div_ceil(8).max(1);
    let passes = blocks.div_ceil(MAX_MT as usize);
    UpPass { nt: if swiglu { 1 } else { 2 }, mt: blocks.div_ceil(passes) as u32 }
}

/// Whether these kernels serve `g` (any row count): axis 1, row-major codes, T 256, k 2..4,
/// L <= 12 (the half table of `2^L` values lives in threadgroup memory).
pub fn supports(g: &TrellisGeometry) -> bool {
    gate_up_factored::supports(g) && g.l <= 12
}

/// Realigned words a lane's window spans: 16 positions, the last one's window `L` bits long,
/// `15k + L` bits from the lane's first bit.
pub fn nw(g: &TrellisGeometry) -> usize {
    (15 * g.k as usize + g.l as usize).div_ceil(32)
}

fn kernel(swiglu: bool) -> Result<&'static MetalKernel> {
    let body = || source_variant(SOURCE, "SWIGLU", swiglu).with_context(|| "Metal kernel gate_up_mma".to_string());
    registered_kernel(key("gate_up_mma", swiglu), arg_names(swiglu), &["out"], body, &[sources::METAL_CODEBOOK, STATE_HEADER, GATE_UP_HEADER])
}

fn launch(
    x2: &MlxArray,
    layer: (&MlxArray, &MlxArray),
    up: Option<(&MlxArray, &MlxArray)>,
    g: &TrellisGeometry,
    pass: UpPass,
) -> Result<MlxArray> {
    let swiglu = up.is_some();
    let what = if swiglu { "swigluMma" } else { "gateUpMma" };
    if !supports(g) {
        unserved!("{what}: serves axis-1 row-major codes with T 256, k 2..4, L <= 12 (got {g})");
    }
    if !(1..=4).contains(&pass.nt) || !(1..=8).contains(&pass.mt) {
        invalid!("{what}: pass {pass:?} needs nt in 1..=4 and mt in 1..=8");
    }
    let m = check_layers(what, x2, layer, up, g)?;
    let (nt, mt) = (pass.nt as usize, pass.mt as usize);
    let tiles = g.rows.div_ceil(8);
    let grid = [TRELLIS_THREADS, tiles.div_ceil(nt * TRELLIS_SG_PER_TG), m.div_ceil(8 * mt)];
    let cfg = axis_one_launch(what, grid, x2, m, g)?
        .template_int("NT", nt as i32)
        .template_int("MT", mt as i32)
        .template_int("NW", nw(g) as i32);
    apply(kernel(swiglu)?, &cfg, x2, layer, up)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer (codes `[out, in*k/32]`),
/// any number of rows, in passes of the given shape.
pub fn gate_up_mma_pass(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    pass: UpPass,
) -> Result<MlxArray> {
    launch(x2, (codes, scales), None, g, pass)
}

/// [`gate_up_mma_pass`] in the pass the row count plans.
pub fn gate_up_mma(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    gate_up_mma_pass(x2, codes, scales, g, plan(m, false))
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, out]` in `x2`'s dtype (gate and up both of geometry `g`) in
/// one kernel, any number of rows, in passes of the given shape.
pub fn swiglu_mma_pass(
    x2: &MlxArray,
    gate_codes: &MlxArray,
    gate_scales: &MlxArray,
    up_codes: &MlxArray,
    up_scales: &MlxArray,
    g: &TrellisGeometry,
    pass: UpPass,
) -> Result<MlxArray> {
    launch(x2, (gate_codes, gate_scales), Some((up_codes, up_scales)), g, pass)
}

/// [`swiglu_mma_pass`] in the pass the row count plans.
pub fn swiglu_mma(
    x2: &MlxArray,
    gate_codes: &MlxArray,
    gate_scales: &MlxArray,
    up_codes: &MlxArray,
    up_scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    swiglu_mma_pass(x2, gate_codes, gate_scales, up_codes, up_scales, g, plan(m, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_shares_the_rows_evenly_over_the_fewest_passes() {
        let mts: Vec<u32> = [1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 48, 49, 64, 65, 96, 128]
            .iter()
            .map(|&m| plan(m, false).mt)
            .collect();
        assert_eq!(mts, [1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 3, 4, 4, 3, 4, 4]);
        assert_eq!((plan(40, false).nt, plan(40, true).nt), (2, 1));
    }

    #[test]
    fn the_window_words_cover_sixteen_positions() {
        for (k, l, words) in [(2, 8, 2), (2, 12, 2), (3, 12, 2), (4, 8, 3), (4, 12, 3)] {
            let g = TrellisGeometry::row_major(8, 256, k, 256, l, 1).unwrap();
            assert_eq!(nw(&g), words, "k {k} L {l}");
        }
    }

    #[test]
    fn both_variants_are_cut_from_the_file() {
        // The code without its comments (the file's opening comment names both variants).
        let code = |t: String| t.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        let linear = code(source_variant(SOURCE, "SWIGLU", false).unwrap());
        let fused = code(source_variant(SOURCE, "SWIGLU", true).unwrap());
        assert!(!linear.contains("up_codes") && !linear.contains("trellis_silu"));
        assert!(fused.contains("up_codes") && fused.contains("accUp") && fused.contains("trellis_silu"));
    }
}
