//! The down kernel's launches: the variant of `down_mma.cu` a call registers, and its launch and
//! pre-pass prepared once per geometry, configuration, row count and dtype (the template
//! arguments, the grid, the shared memory, the sizes checked against CUDA's limits).

use std::sync::Arc;

use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::int;
use crate::trellis::cuda::prescale::{PrePass, PrePassOutput, PAIR_FLAG};
use crate::trellis::format::{CodeLayout, TrellisGeometry};

use super::config::CudaDownConfig;

const SOURCE: &str = sources::CUDA_DOWN_MMA;
const HEADER: &str = sources::CUDA_DOWN_MMA_HEADER;

/// Prescaled rows are padded to a multiple of this (whole steps of any `ks`; see prescale.cu).
const PRESCALED_ROW_MULTIPLE: usize = 64;

/// The section flag of the residual variant of `down_mma.cu`.
const RESIDUAL_FLAG: &str = "TRELLIS_RESIDUAL";

/// The section flag of the rotated-output variant of `down_mma.cu`.
const ROTATE_OUT_FLAG: &str = "TRELLIS_ROTATE_OUT";

/// An output rotation the kernel applies in its fold: the logical output columns it writes and
/// the rotation's block (docs/format.md §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FoldRotation {
    pub(super) logical: usize,
    pub(super) block: usize,
}

/// The variant of the kernel file a call runs: one matrix, or two of one geometry on the same
/// activations (the `TRELLIS_PAIR` sections); plus a residual added in the fold (one matrix, the
/// `TRELLIS_RESIDUAL` sections); with the outputs' inverse rotation in the fold
/// (`TRELLIS_ROTATE_OUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Variant {
    pub(super) pair: bool,
    pub(super) residual: bool,
    pub(super) rotation: Option<FoldRotation>,
}

impl Variant {
    /// One matrix, its output as stored.
    #[cfg(test)]
    pub(super) const SINGLE: Variant = Variant { pair: false, residual: false, rotation: None };

    /// The variant's name in the kernel registry.
    fn name(self) -> &'static str {
        match (self.pair, self.residual, self.rotation.is_some()) {
            (false, false, false) => "",
            (true, _, false) => "pair",
            (false, true, false) => "residual",
            (false, false, true) => "rotate",
            (true, _, true) => "pair_rotate",
            (false, true, true) => "residual_rotate",
        }
    }

    /// The kernel's inputs, in `apply` order.
    fn inputs(self) -> &'static [&'static str] {
        match (self.pair, self.residual, self.rotation.is_some()) {
            (false, false, false) => &["x", "codes", "scales", "counters", "x_exp"],
            (true, _, false) => &["x", "codes", "scales", "counters", "x_exp", "codes_b", "scales_b"],
            (false, true, false) => &["x", "codes", "scales", "counters", "x_exp", "residual"],
            (false, false, true) => &["x", "codes", "scales", "counters", "x_exp", "signs"],
            (true, _, true) => {
                &["x", "codes", "scales", "counters", "x_exp", "codes_b", "scales_b", "signs", "signs_b"]
            }
            (false, true, true) => &["x", "codes", "scales", "counters", "x_exp", "residual", "signs"],
        }
    }

    /// The variant's text: `down_mma.cu` with the variant's own sections only.
    fn source(self) -> Result<String> {
        source_variant(SOURCE, PAIR_FLAG, self.pair)
            .and_then(|text| source_variant(&text, RESIDUAL_FLAG, self.residual))
            .and_then(|text| source_variant(&text, ROTATE_OUT_FLAG, self.rotation.is_some()))
            .context("CUDA down kernel source down_mma.cu")
    }
}

/// The kernel registered with `shared_memory` bytes of dynamic shared memory, one per size and
/// variant (MLX takes the size when a kernel is registered; it is a function of the template
/// arguments, so each compiled instantiation always launches with the same size).
fn kernel(shared_memory: usize, variant: Variant) -> Result<&'static CudaKernel> {
    let key = KernelKey { family: "down_mma", variant: variant.name(), shared_memory, launch_bounds: None };
    registry::cuda(key, || {
        Ok(KernelText {
            inputs: variant.inputs(),
            outputs: if variant.pair { &["y", "y_b", "partial"] } else { &["y", "partial"] },
            body: variant.source()?,
            header: if variant.rotation.is_some() {
                [sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT, sources::CUDA_HADAMARD, HEADER].join("\n")
            } else {
                [sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT, HEADER].join("\n")
            },
        })
    })
}

/// One call's launches, prepared once (see [`prepared_launch`]): the down kernel (or, in `ws`,
/// the warp-specialized GEMM) and the pre-pass before it (`prescale.cu`: the rows' exponents, the
/// zeroed fold counters and, for prescaled configurations, the converted activations), which a
/// fed call does not run.
pub(super) struct PreparedDown {
    pub(super) kernel: &'static CudaKernel,
    pub(super) launch: CudaLaunch,
    pub(super) pre_pass: CudaLaunch,
}

/// One call's shape: what its launches are prepared for, and their cache's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Call {
    g: TrellisGeometry,
    cfg: CudaDownConfig,
    /// Activation rows.
    m: usize,
    /// The activations' dtype.
    dtype: Dtype,
    variant: Variant,
    /// Counters from the launch before, exponents found by the blocks (`BLOCK_EXP`).
    fed: bool,
}

/// The kernel and its launch for `m` rows of `dtype` activations, checked and converted once
/// per geometry, configuration, row count and dtype: a model makes the same few calls many
/// times, and building the template arguments at every call costs host time.
pub(super) fn prepared_launch(
    g: &TrellisGeometry,
    cfg: CudaDownConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    fed: bool,
) -> Result<Arc<PreparedDown>> {
    static LAUNCHES: LaunchCache<Call, PreparedDown> = LaunchCache::new(1024);
    let call = Call { g: *g, cfg, m, dtype, variant, fed };
    LAUNCHES.get_or_build(call, || prepare(call))
}

/// [`prepared_launch`]'s work on a miss.
fn prepare(Call { g, cfg, m, dtype, variant, fed }: Call) -> Result<PreparedDown> {
    let g = &g;
    cfg.check(g, dtype)?;
    let pair = variant.pair;
    if let Some(r) = variant.rotation {
        if !cfg.rotates_in_fold(g, r.block, dtype)
            || r.logical == 0
            || !r.logical.is_multiple_of(r.block)
            || r.logical > g.cols
        {
            invalid!(
                "CUDA down kernel: {} logical outputs of {g} rotated in blocks of {} cannot be turned back in the fold of {cfg:?} ({dtype} activations)",
                r.logical,
                r.block
            );
        }
    }
    let out_cols = variant.rotation.map_or(g.cols, |r| r.logical);
    let mats = if pair { 2 } else { 1 };
    // Prescaled activations: [mats * sets * m, row_pad] f16 (the f32 residues are the second
    // set; the pair's second matrix's rows follow the first's).
    let row_pad = g.rows.next_multiple_of(PRESCALED_ROW_MULTIPLE);
    let sets = if dtype == Dtype::Float32 { 2 } else { 1 };
    // The kernel indexes them with 32-bit offsets, and the pre-pass runs one grid row per
    // activation row of each matrix (CUDA's grid y is at most 65535).
    let prescaled_values = [mats, sets, m, row_pad].into_iter().try_fold(1usize, usize::checked_mul);
    if cfg.prescaled && (prescaled_values.is_none_or(|n| n > i32::MAX as usize) || mats * m > 65535) {
        invalid!("CUDA down kernel: {m} rows of {dtype} activations of {g} are too many for prescaled B tiles (at most 65535 rows and 2^31 - 1 f16 values; {mats} x {sets} x {m} x {row_pad} here)");
    }
    let passes = m.div_ceil(8 * cfg.mt as usize);
    let ctas = cfg.column_blocks(g) * mats;
    // Grid y holds the column tiles (of both matrices of a pair), z the splits of every pass
    // (CUDA's y and z are at most 65535).
    let grid_z = cfg.splits as usize * passes;
    if ctas > 65535 || grid_z > 65535 {
        invalid!("CUDA down kernel: {m} rows of {g} are too many for one launch grid ({ctas} column tiles by {} splits x {passes} passes; at most 65535 each)", cfg.splits);
    }
    let kernel = kernel(cfg.shared_bytes(g, dtype == Dtype::Float32), variant)?;
    let threads = 32 * cfg.warps as usize;
    let counters = ctas * passes;
    let mut launch = LaunchConfig::new([threads, ctas, grid_z], [threads, 1, 1]).output(&[m, out_cols], dtype);
    if pair {
        launch = launch.output(&[m, out_cols], dtype);
    }
    if let Some(r) = variant.rotation {
        // The host's scale, so that the product is the one rotate.cu and `hadamard_transform` take.
        let scale = 1.0 / (r.block as f32).sqrt();
        launch = launch
            .template_int("N", int("CUDA down kernel", r.logical)?)
            .template_int("RB", int("CUDA down kernel", r.block)?)
            .template_int("SCALE_BITS", scale.to_bits() as i32);
    }
    let launch = launch
        .output(&[mats * m, cfg.splits as usize, g.cols], Dtype::Float32)
        .template_dtype("Y", dtype)
        // Prescaled activations are f16 whatever the call's dtype.
        .template_dtype("T", if cfg.prescaled { Dtype::Float16 } else { dtype });
    let launch = geometry_args(launch, g, "CUDA down kernel")?
        .template_int("BLOCK_LEN", g.t as i32)
        .template_int("NC", cfg.nc as i32)
        .template_int("MT", cfg.mt as i32)
        .template_int("KS", cfg.ks as i32)
        .template_int("WARPS", cfg.warps as i32)
        .template_int("SPLITS", cfg.splits as i32)
        .template_int("STAGES", cfg.stages as i32)
        .template_bool("INTERLEAVE", g.layout() == CodeLayout::K3Interleaved)
        .template_bool("SPLIT_X", dtype == Dtype::Float32)
        .template_bool("BIAS_FOLD", cfg.bias_fold && dtype != Dtype::Float32)
        .template_bool("PACK_FMA", cfg.pack_fma && dtype != Dtype::Float32)
        .template_bool("PRESCALED", cfg.prescaled)
        .template_bool("MBARRIERS", cfg.mbarriers)
        .template_int("UNROLLED_STEPS", cfg.step_unroll.template_int())
        .template_bool("BLOCK_EXP", fed)
        .template_bool("DIRECT_CODES", cfg.direct_codes);
    let launch = kernel.prepare(&launch)?;
    let output = if cfg.prescaled { PrePassOutput::Activations } else { PrePassOutput::ExponentsOnly };
    let pre_pass = PrePass {
        m,
        width: g.rows,
        row_pad,
        dtype,
        counters,
        row_scales: true,
        output,
        pair,
        row_sums: false,
        wgmma_order: false,
        image_rows: 0,
    }
    .prepare()?;
    Ok(PreparedDown { kernel, launch, pre_pass })
}

/// `launch` with the geometry's template ints that every down kernel takes: R and C (the stored
/// rows and columns), K and L; `what` names the kernel in an error.
pub(super) fn geometry_args(launch: LaunchConfig, g: &TrellisGeometry, what: &str) -> Result<LaunchConfig> {
    Ok(launch
        .template_int("R", int(what, g.rows)?)
        .template_int("C", int(what, g.cols)?)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_source_is_compacted() {
        // Text outside the compactor's plain subset would go as written.
        for (text, file) in
            [(SOURCE, "down_mma.cu"), (HEADER, "down_mma.cuh"), (sources::CUDA_FRAGMENT, "fragment.cuh")]
        {
            let compact = crate::kernel::compact::compact_plain_cpp(text).unwrap_or_else(|| panic!("{file}"));
            assert!(compact.len() < text.len(), "{file}");
        }
    }

    #[test]
    fn each_variant_registers_only_its_own_sections() {
        // Registered compacted: comments (which name every variant) are gone.
        let compact = |text, pair| {
            crate::kernel::compact::compact_plain_cpp(&source_variant(text, PAIR_FLAG, pair).unwrap()).unwrap()
        };
        let (single, pair) = (compact(sources::CUDA_PRESCALE, false), compact(sources::CUDA_PRESCALE, true));
        assert!(pair.contains("scales_b") && !single.contains("scales_b"));
        assert!(!single.contains(PAIR_FLAG) && !pair.contains(PAIR_FLAG));
        let down = |v: Variant| crate::kernel::compact::compact_plain_cpp(&v.source().unwrap()).unwrap();
        let single = down(Variant::SINGLE);
        let pair = down(Variant { pair: true, ..Variant::SINGLE });
        let residual = down(Variant { residual: true, ..Variant::SINGLE });
        let rotation = Some(FoldRotation { logical: 576, block: 64 });
        let rotate = down(Variant { rotation, ..Variant::SINGLE });
        let pair_rotate = down(Variant { pair: true, rotation, ..Variant::SINGLE });
        let residual_rotate = down(Variant { residual: true, rotation, ..Variant::SINGLE });
        assert!(pair.contains("codes_b") && !single.contains("codes_b") && !residual.contains("codes_b"));
        assert!(residual.contains("res = residual + (size_t)m * C + col"), "{residual}");
        assert!(!single.contains("residual") && !pair.contains("residual"));
        // The rotated outputs: the signs (the pair's two), the residual of the logical width.
        assert!(pair_rotate.contains("signs_b") && pair_rotate.contains("codes_b") && !rotate.contains("signs_b"));
        assert!(residual_rotate.contains("residual[(size_t)m * N + col]"), "{residual_rotate}");
        assert!(!rotate.contains("residual") && !pair_rotate.contains("residual"));
        for text in [&single, &pair, &residual] {
            assert!(!text.contains("signs") && !text.contains("butterfly"), "{text}");
        }
        for text in [&single, &pair, &residual, &rotate, &pair_rotate, &residual_rotate] {
            assert!(!text.contains(PAIR_FLAG) && !text.contains(RESIDUAL_FLAG) && !text.contains(ROTATE_OUT_FLAG));
        }
        // Six variants, six names in the registry.
        let names: std::collections::HashSet<_> = [false, true]
            .into_iter()
            .flat_map(|pair| [false, true].map(move |residual| (pair, residual)))
            .filter(|&(pair, residual)| !(pair && residual))
            .flat_map(|(pair, residual)| {
                [None, rotation].map(move |rotation| Variant { pair, residual, rotation }.name())
            })
            .collect();
        assert_eq!(names.len(), 6);
    }

    #[test]
    fn too_many_rows_for_prescaled_b_tiles_is_an_error_that_says_so() {
        // Caught while the launch is prepared, before anything runs (so on every back-end).
        let g = TrellisGeometry::row_major(16, 256, 2, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 2, mt: 8, ks: 1, warps: 8, splits: 1, prescaled: true, ..Default::default() };
        cfg.check(&g, Dtype::Float32).unwrap();
        let err = prepared_launch(&g, cfg, 65536, Dtype::Float32, Variant::SINGLE, false)
            .err()
            .expect("65536 rows")
            .to_string();
        assert!(err.contains("too many for prescaled B tiles") && err.contains("65536 rows"), "{err}");
    }

    #[test]
    fn a_grid_past_cudas_limits_is_an_error_that_says_so() {
        let g = TrellisGeometry::row_major(16, 256, 2, 256, 12, 0).unwrap();
        let cfg = CudaDownConfig { nc: 2, mt: 1, ks: 1, warps: 8, splits: 1, ..Default::default() };
        cfg.check(&g, Dtype::Float32).unwrap();
        // 8 rows a pass, one split: 65536 passes are one more than grid z holds.
        let err = prepared_launch(&g, cfg, 8 * 65536, Dtype::Float32, Variant::SINGLE, false)
            .err()
            .expect("65536 passes")
            .to_string();
        assert!(err.contains("too many for one launch grid") && err.contains("65536 passes"), "{err}");
    }
}
