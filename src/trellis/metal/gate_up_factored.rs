//! Gate/up projections (axis 1) and the fused gate·up·SwiGLU for 1..8 activation rows with the
//! 1MAD arithmetic, on Metal: `kernels/metal/gate_up_factored.metal` (a new family in the
//! upstream style; upstream has no axis-1 kernels).
//!
//! Codes `[R, C*k/32]` (`R` output rows, `C` inputs) hold each output row's trellis along its
//! input, so the reduction runs inside one stored row: a SIMD group owns output rows (`NR` of
//! them) and walks their 256-weight blocks, lane `l` decoding bit-order positions `8l..8l+7` of
//! every block, and one `simd_sum` per output folds the lanes. The scale and `1/147.8` are folded
//! in once per output and the output is written in the activation dtype: no partials, no MLX
//! fold. Two kernels (one activation row; 2..8 rows sharing each decoded weight), each in two
//! variants: one projection, and the fused `silu(x · Wg) ⊙ (x · Wu)` that reads both code
//! tensors for the same output rows.

use crate::array::MlxArray;
use crate::error::{unserved, ErrorContext, Result};
use crate::kernel::registry::KernelKey;
use crate::kernel::variant::{kernel_section, source_variant};
use crate::kernel::{LaunchConfig, MetalKernel};

use super::launch::{registered_kernel, TRELLIS_SG_PER_TG, TRELLIS_THREADS};
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::checks::{check_layer, check_operands, int};
use crate::kernel::sources;

const FILE: &str = sources::METAL_GATE_UP_FACTORED;
/// The axis-1 helpers, shared with [`gate_up_mma`](super::gate_up_mma): `lane_codes`,
/// `trellis_silu`, and `realign_window` (used by `gate_up_mma` only).
pub(crate) const GATE_UP_HEADER: &str = sources::METAL_GATE_UP_HEADER;

/// Output rows per SIMD group of one projection: each block's 8 activations per lane are loaded
/// once for the four rows.
pub const NR: usize = 4;
/// Output rows per SIMD group of the fused kernel: two rows of each projection, the same four
/// decoded rows per block (and accumulators) as [`NR`] rows of one projection.
pub const NR_SWIGLU: usize = 2;
/// The most activation rows the kernels serve.
pub const MAX_ROWS: usize = 8;

/// Whether these kernels serve `g` (for 1..8 rows): axis 1, row-major codes, T 256, k 2..4,
/// L <= 16.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 1 && g.layout() == CodeLayout::RowMajor && g.t == 256 && (2..=4).contains(&g.k) && g.l <= 16
}

/// Refuses as unserved what [`supports`] does not serve (`what` names the kernel).
fn require_supported(what: &str, g: &TrellisGeometry) -> Result<()> {
    if !supports(g) {
        unserved!("{what}: serves axis-1 row-major codes with T 256, k 2..4, L <= 16 (got {g})");
    }
    Ok(())
}

/// The input and output names of a variant: the fused one also reads the up projection.
pub(crate) fn arg_names(swiglu: bool) -> &'static [&'static str] {
    if swiglu {
        &["x", "codes", "scales", "up_codes", "up_scales"]
    } else {
        &["x", "codes", "scales"]
    }
}

/// The registry key of an axis-1 `family` in one variant.
pub(crate) fn key(family: &'static str, swiglu: bool) -> KernelKey {
    KernelKey { variant: if swiglu { "swiglu" } else { "linear" }, ..KernelKey::of(family) }
}

/// Checks `x2 [M, C]` and the gate's (or only) layer, then the up layer (the same geometry) of
/// the fused kernel; returns `M`.
pub(crate) fn check_layers(
    what: &str,
    x2: &MlxArray,
    layer: (&MlxArray, &MlxArray),
    up: Option<(&MlxArray, &MlxArray)>,
    g: &TrellisGeometry,
) -> Result<usize> {
    let m = check_operands(what, x2, layer.0, layer.1, g)?;
    if let Some((codes, scales)) = up {
        check_layer(&format!("{what} (up projection)"), codes, scales, g)?;
    }
    Ok(m)
}

/// The launch both axis-1 families start from: `grid` threads in threadgroups of
/// [`TRELLIS_THREADS`], the output `[m, R]` in `x2`'s dtype, and the template values
/// `T, R, C, K, L, SG_TG` (each family appends its own).
pub(crate) fn axis_one_launch(
    what: &str,
    grid: [usize; 3],
    x2: &MlxArray,
    m: usize,
    g: &TrellisGeometry,
) -> Result<LaunchConfig> {
    Ok(LaunchConfig::new(grid, [TRELLIS_THREADS, 1, 1])
        .output(&[m, g.rows], x2.dtype())
        .template_dtype("T", x2.dtype())
        .template_int("R", int(what, g.rows)?)
        .template_int("C", int(what, g.cols)?)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("SG_TG", TRELLIS_SG_PER_TG as i32))
}

/// Runs an axis-1 `kernel` on `x2`, the layer and (fused) the up layer; returns its output.
pub(crate) fn apply(
    kernel: &MetalKernel,
    cfg: &LaunchConfig,
    x2: &MlxArray,
    layer: (&MlxArray, &MlxArray),
    up: Option<(&MlxArray, &MlxArray)>,
) -> Result<MlxArray> {
    let mut inputs = vec![x2, layer.0, layer.1];
    if let Some((codes, scales)) = up {
        inputs.extend([codes, scales]);
    }
    Ok(kernel.apply(&inputs, cfg)?.remove(0))
}

/// The registered kernel of `section` in one variant.
fn kernel(section: &'static str, swiglu: bool) -> Result<&'static MetalKernel> {
    let family = if section == "ROW" { "gate_up_factored_row" } else { "gate_up_factored_rows" };
    let body = || {
        source_variant(kernel_section(FILE, section), "SWIGLU", swiglu)
            .with_context(|| format!("Metal kernel {family}"))
    };
    registered_kernel(key(family, swiglu), arg_names(swiglu), &["out"], body, &[sources::METAL_CODEBOOK, GATE_UP_HEADER])
}

/// Checks the call and returns `M`: `x2 [M, C]` (1..8 rows, or exactly 1 for `ROW`), the gate's
/// (or only) layer, and the up layer (the same geometry) for the fused kernel.
fn check(
    what: &str,
    section: &str,
    x2: &MlxArray,
    layer: (&MlxArray, &MlxArray),
    up: Option<(&MlxArray, &MlxArray)>,
    g: &TrellisGeometry,
) -> Result<usize> {
    require_supported(what, g)?;
    let m = check_layers(what, x2, layer, up, g)?;
    match section {
        "ROW" if m != 1 => unserved!("{what}: serves one activation row (got {m})"),
        "ROWS" if !(2..=MAX_ROWS).contains(&m) => unserved!("{what}: M={m} outside 2..{MAX_ROWS}"),
        _ => Ok(m),
    }
}

fn launch(
    section: &'static str,
    x2: &MlxArray,
    layer: (&MlxArray, &MlxArray),
    up: Option<(&MlxArray, &MlxArray)>,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    let swiglu = up.is_some();
    let what = match (section, swiglu) {
        ("ROW", false) => "gateUpFactoredRow",
        ("ROW", true) => "swigluFactoredRow",
        (_, false) => "gateUpFactoredRows",
        (_, true) => "swigluFactoredRows",
    };
    let m = check(what, section, x2, layer, up, g)?;
    let nr = if swiglu { NR_SWIGLU } else { NR };
    let groups = g.rows.div_ceil(nr);
    let grid = [TRELLIS_THREADS, groups.div_ceil(TRELLIS_SG_PER_TG), 1];
    let mut cfg = axis_one_launch(what, grid, x2, m, g)?.template_int("NR", nr as i32);
    if section == "ROWS" {
        cfg = cfg.template_int("M", m as i32);
    }
    apply(kernel(section, swiglu)?, &cfg, x2, layer, up)
}

/// `x2 [1, in] · W -> [1, out]` in `x2`'s dtype for an axis-1 layer (codes `[out, in*k/32]`).
pub fn gate_up_factored_row(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    launch("ROW", x2, (codes, scales), None, g)
}

/// `x2 [M, in] · W -> [M, out]` for 2..8 activation rows sharing each decoded weight.
pub fn gate_up_factored_rows(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    launch("ROWS", x2, (codes, scales), None, g)
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[1, out]` in `x2`'s dtype: gate and up (both of geometry `g`)
/// in one kernel.
pub fn swiglu_factored_row(
    x2: &MlxArray,
    gate_codes: &MlxArray,
    gate_scales: &MlxArray,
    up_codes: &MlxArray,
    up_scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    launch("ROW", x2, (gate_codes, gate_scales), Some((up_codes, up_scales)), g)
}

/// [`swiglu_factored_row`] for 2..8 activation rows.
pub fn swiglu_factored_rows(
    x2: &MlxArray,
    gate_codes: &MlxArray,
    gate_scales: &MlxArray,
    up_codes: &MlxArray,
    up_scales: &MlxArray,
    g: &TrellisGeometry,
) -> Result<MlxArray> {
    launch("ROWS", x2, (gate_codes, gate_scales), Some((up_codes, up_scales)), g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_variants_of_both_sections_are_cut_from_the_file() {
        for section in ["ROW", "ROWS"] {
            let text = kernel_section(FILE, section);
            let linear = source_variant(text, "SWIGLU", false).unwrap();
            let fused = source_variant(text, "SWIGLU", true).unwrap();
            assert_eq!(linear.lines().count(), fused.lines().count(), "{section}: lines keep their numbers");
            let directives = |t: &str| t.lines().any(|l| ["#if", "#else", "#endif"].iter().any(|d| l.trim().starts_with(d)));
            assert!(!linear.contains("up_codes") && !linear.contains("trellis_silu") && !directives(&linear), "{section}");
            assert!(fused.contains("up_codes") && fused.contains("trellis_silu") && !directives(&fused), "{section}");
            assert!(linear.contains("metal::simd_sum(acc[r]") || linear.contains("metal::simd_sum(acc[r][m])"));
        }
    }
}
