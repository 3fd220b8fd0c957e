//! The axis-1 kernels' launches: the kernel file and variant a call registers, and its launch,
//! prepared once per geometry, shape, row count, dtype and variant, with the pre-pass that hands
//! the activations over as f16 where the kernel reads them so.

use std::sync::Arc;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchBounds, LaunchConfig};
use crate::trellis::format::TrellisGeometry;

use super::super::prescale::{self, PrePass, PrePassOutput};
use super::config::{AxisOneConfig, AxisOneKernel, INT8_MAX_ROWS, STAGED_RESIDENT_WARPS};

/// The variant of the kernel file a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Variant {
    /// One projection.
    Single,
    /// One projection plus a residual (the `TRELLIS_RESIDUAL` sections).
    Residual,
    /// Gate and up with the SwiGLU (the `TRELLIS_FUSED` sections); the up projection's k, and
    /// the down kernel's fold counters it zeroes for the launch after it (the fragment kernel's
    /// `TRELLIS_FEED` sections; 0: none; at most `i32::MAX`, its template int's range, which
    /// `swiglu_feeding` checks).
    Fused { up_bits: u32, feed: u32 },
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Single => "single",
            Variant::Residual => "residual",
            Variant::Fused { feed: 0, .. } => "fused",
            Variant::Fused { .. } => "fused_feed",
        }
    }

    /// The kernel's inputs, in `apply` order (the int8 kernel reads no row exponents; the GEMM
    /// also the rows' sums).
    pub(super) fn inputs(self, kernel: AxisOneKernel) -> &'static [&'static str] {
        let all: &'static [&'static str] = match self {
            Variant::Single => &["x", "x_exp", "codes", "scales"],
            Variant::Residual => &["x", "x_exp", "codes", "scales", "residual"],
            Variant::Fused { .. } => &["x", "x_exp", "codes", "scales", "up_codes", "up_scales"],
        };
        match kernel {
            AxisOneKernel::Fragment => return all,
            AxisOneKernel::Gemm | AxisOneKernel::Wgmma => {
                return match self {
                    Variant::Single => &["x", "x_exp", "x_sum", "codes", "scales"],
                    Variant::Residual => &["x", "x_exp", "x_sum", "codes", "scales", "residual"],
                    Variant::Fused { .. } => &["x", "x_exp", "x_sum", "codes", "scales", "up_codes", "up_scales"],
                }
            }
            AxisOneKernel::Specialized => {
                return match self {
                    Variant::Single => &["x", "x_exp", "x_sum", "counters", "codes", "scales"],
                    Variant::Residual => &["x", "x_exp", "x_sum", "counters", "codes", "scales", "residual"],
                    Variant::Fused { .. } => {
                        &["x", "x_exp", "x_sum", "counters", "codes", "scales", "up_codes", "up_scales"]
                    }
                }
            }
            AxisOneKernel::Int8 => {}
        }
        match self {
            Variant::Single => &["x", "codes", "scales"],
            Variant::Residual => &["x", "codes", "scales", "residual"],
            Variant::Fused { .. } => &["x", "codes", "scales", "up_codes", "up_scales"],
        }
    }

    /// The kernel's outputs (the warp-specialized GEMM's scratch for the parts of the tiles its
    /// thread blocks share).
    fn outputs(self, kernel: AxisOneKernel) -> &'static [&'static str] {
        match self {
            _ if kernel == AxisOneKernel::Specialized => &["y", "partials"],
            Variant::Fused { feed: 1.., .. } => &["y", "counters"],
            _ => &["y"],
        }
    }

    /// The variant's text: `kernel`'s file with the variant's own sections only.
    fn source(self, kernel: AxisOneKernel) -> Result<String> {
        let (text, file) = kernel_file(kernel);
        let feed = matches!(self, Variant::Fused { feed: 1.., .. });
        if feed && !matches!(kernel, AxisOneKernel::Fragment | AxisOneKernel::Gemm) {
            invalid!("CUDA axis-1 kernel: only the fragment kernel and the GEMM zero the down kernel's counters (not {file})");
        }
        let fused = source_variant(text, "TRELLIS_FUSED", matches!(self, Variant::Fused { .. }));
        fused
            .and_then(|text| source_variant(&text, "TRELLIS_RESIDUAL", self == Variant::Residual))
            .and_then(|text| source_variant(&text, "TRELLIS_FEED", feed))
            .with_context(|| format!("CUDA axis-1 kernel source {file}"))
    }
}

/// `kernel`'s file: its text and its name.
fn kernel_file(kernel: AxisOneKernel) -> (&'static str, &'static str) {
    match kernel {
        AxisOneKernel::Fragment => (sources::CUDA_GATE_UP, "gate_up.cu"),
        AxisOneKernel::Int8 => (sources::CUDA_GATE_UP_INT8, "gate_up_int8.cu"),
        AxisOneKernel::Gemm => (sources::CUDA_GATE_UP_GEMM, "gate_up_gemm.cu"),
        AxisOneKernel::Wgmma => (sources::CUDA_GATE_UP_WGMMA, "gate_up_wgmma.cu"),
        AxisOneKernel::Specialized => (sources::CUDA_GATE_UP_WS, "gate_up_ws.cu"),
    }
}

/// `kernel`'s `variant`, registered with `shared` bytes of dynamic shared memory (the int8
/// kernel's, the GEMM's, and the fragment kernel's staged rows).
fn kernel(
    variant: Variant,
    kernel: AxisOneKernel,
    shared: usize,
    launch_bounds: Option<LaunchBounds>,
) -> Result<&'static CudaKernel> {
    let family = match kernel {
        AxisOneKernel::Fragment => "gate_up",
        AxisOneKernel::Int8 => "gate_up_int8",
        AxisOneKernel::Gemm => "gate_up_gemm",
        AxisOneKernel::Wgmma => "gate_up_wgmma",
        AxisOneKernel::Specialized => "gate_up_ws",
    };
    let key = KernelKey { family, variant: variant.name(), shared_memory: shared, launch_bounds };
    registry::cuda(key, || {
        let mut header = vec![sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT, sources::CUDA_AXIS_ONE];
        match kernel {
            AxisOneKernel::Int8 => header.push(sources::CUDA_GATE_UP_INT8_HEADER),
            AxisOneKernel::Wgmma => header.push(sources::CUDA_WGMMA),
            AxisOneKernel::Specialized => header.extend([sources::CUDA_WGMMA, sources::CUDA_STREAM_K]),
            AxisOneKernel::Fragment | AxisOneKernel::Gemm => {}
        }
        Ok(KernelText {
            inputs: variant.inputs(kernel),
            outputs: variant.outputs(kernel),
            body: variant.source(kernel)?,
            header: header.join("\n"),
        })
    })
}

/// One call's kernel and launch, prepared once per geometry, shape, row count, dtype and variant
/// (and the up projection's bit width in the fused one), with the pre-pass that hands bf16
/// activations over as f16 where the kernel reads them so.
pub(super) struct Prepared {
    pub(super) kernel: &'static CudaKernel,
    pub(super) launch: CudaLaunch,
    kernel_kind: AxisOneKernel,
    hand_over: Option<CudaLaunch>,
}

impl Prepared {
    /// The kernel's activation inputs for `x2` in `apply` order: the pre-pass's f16 activations,
    /// their rows' exponents, (the GEMMs) their rows' sums and (the warp-specialized GEMM) the
    /// fold counters it zeroed, or `x2` itself with `placeholder`
    /// (any f16 array) as `x_exp`, which the kernel then does not read (the int8 kernel takes
    /// `x2` alone).
    pub(super) fn kernel_inputs(&self, x2: &MlxArray, placeholder: &MlxArray) -> Result<Vec<MlxArray>> {
        match &self.hand_over {
            Some(launch) => {
                let prescale::PrePassArrays { x_scaled: x, counters, x_exp, x_sum } =
                    prescale::run(false, &[x2, placeholder], launch, "CUDA axis-1 kernel")?;
                Ok(match self.kernel_kind {
                    AxisOneKernel::Specialized => vec![x, x_exp, x_sum, counters],
                    AxisOneKernel::Gemm | AxisOneKernel::Wgmma => vec![x, x_exp, x_sum],
                    AxisOneKernel::Fragment | AxisOneKernel::Int8 => vec![x, x_exp],
                })
            }
            None if self.kernel_kind == AxisOneKernel::Int8 => Ok(vec![x2.clone()]),
            None => Ok(vec![x2.clone(), placeholder.clone()]),
        }
    }
}

/// Rows of bf16 activations from which the fragment kernel reads them as f16, converted once per
/// call by the pre-pass (each row brought into f16's range by a power of two): every row tile of
/// the layer converts its fragments again otherwise.
pub const CONVERT_MIN_ROWS: usize = 17;

/// The dtype `kernel` reads `m` rows of `dtype` activations in: the GEMMs always the pre-pass's
/// f16; the others bf16 as the pre-pass's f16 from [`CONVERT_MIN_ROWS`] rows, else as given.
fn read_dtype(dtype: Dtype, m: usize, kernel: AxisOneKernel) -> Dtype {
    if matches!(kernel, AxisOneKernel::Gemm | AxisOneKernel::Wgmma | AxisOneKernel::Specialized)
        || (dtype == Dtype::Bfloat16 && m >= CONVERT_MIN_ROWS)
    {
        Dtype::Float16
    } else {
        dtype
    }
}

/// The launch of `m` rows of `dtype` activations (also the output's dtype) in `cfg`'s kernel and
/// shape. `g` is the gate's (or the only) geometry.
pub(super) fn prepared_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
) -> Result<Arc<Prepared>> {
    type Key = (TrellisGeometry, AxisOneConfig, usize, Dtype, Variant);
    static LAUNCHES: LaunchCache<Key, Prepared> = LaunchCache::new(1024);
    let fused = matches!(variant, Variant::Fused { .. });
    LAUNCHES.get_or_build((*g, cfg, m, dtype, variant), || {
        cfg.check(dtype, fused)?;
        let outputs = g.out_features();
        let row_tiles = outputs.div_ceil(16 * cfg.rt as usize);
        let passes = m.div_ceil(cfg.pass_rows());
        // Grid y holds the row tiles, z the passes (CUDA's y and z are at most 65535).
        if row_tiles > 65535 || passes > 65535 {
            invalid!("CUDA axis-1 kernel: {m} rows of {g} are too many for one launch grid ({row_tiles} row tiles by {passes} passes; at most 65535 each)");
        }
        match cfg.kernel {
            AxisOneKernel::Int8 => return prepared_int8_launch(g, cfg, m, dtype, variant, row_tiles),
            AxisOneKernel::Gemm | AxisOneKernel::Wgmma => return prepared_gemm_launch(g, cfg, m, dtype, variant, passes),
            AxisOneKernel::Specialized => return prepared_ws_launch(g, cfg, m, dtype, variant, passes),
            AxisOneKernel::Fragment => {}
        }
        let sixteen_bit = dtype != Dtype::Float32;
        let read = read_dtype(dtype, m, cfg.kernel);
        let launch = common_launch(g, cfg, m, read, dtype, variant, [row_tiles, passes])
            .template_int("MT", cfg.mt as i32)
            .template_bool("SPLIT_X", !sixteen_bit)
            .template_bool("BIAS_FOLD", cfg.bias_fold && sixteen_bit)
            .template_bool("PACK_FMA", cfg.pack_fma && cfg.bias_fold && sixteen_bit)
            // Rows' powers of two: found by the kernel for bf16 and f32 read as they are, given
            // by the pre-pass for handed-over activations, none for f16 (see gate_up.cu).
            .template_bool("LIFT", read != Dtype::Float16)
            .template_bool("HANDED", read != dtype);
        // The staged rows where they fit (`check` refused them for f32); from global memory
        // otherwise, the same numbers.
        let staged = cfg.stage_shared_bytes(m, g.in_features()).unwrap_or(0);
        let launch = launch.template_bool("STAGE", staged > 0);
        let kernel = kernel(variant, AxisOneKernel::Fragment, staged, staged_bounds(cfg, staged))?;
        let hand_over = if read != dtype { Some(hand_over(g, m, dtype, false, HandOverOrder::Natural, 0)?) } else { None };
        Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, kernel_kind: AxisOneKernel::Fragment, hand_over })
    })
}

/// The staged fragment kernel's launch bounds (`staged` bytes of rows in shared memory, 0 where
/// not staged): registers for [`STAGED_RESIDENT_WARPS`] warps an SM, in blocks of `cfg.warps`
/// warps. Without them ptxas gave the 4-warp block 98 registers with the H200's NVRTC, which
/// leaves room for four blocks an SM instead of five (docs/cuda-mlp.md). `None` where not staged
/// or where [`STAGED_RESIDENT_WARPS`] is 0.
fn staged_bounds(cfg: AxisOneConfig, staged: usize) -> Option<LaunchBounds> {
    let min_blocks = (STAGED_RESIDENT_WARPS / cfg.warps).max(1);
    (staged > 0 && STAGED_RESIDENT_WARPS > 0).then_some(LaunchBounds { threads: 32 * cfg.warps, min_blocks })
}

/// The order in which the pre-pass stores the activations it hands over.
#[derive(Debug, Clone, Copy)]
enum HandOverOrder {
    /// Row-major, as given.
    Natural,
    /// The order the warpgroup GEMM's tensor cores read (`gate_up_wgmma.cu`).
    Wgmma,
    /// The warp-specialized GEMM's image of its stages, in passes of this many rows
    /// (`gate_up_ws.cu`).
    Image(usize),
}

/// The pre-pass that hands `m` rows of `dtype` activations of `g`'s inputs over as f16, each row
/// multiplied by its power of two (`prescale.cu`, no scales), with `row_sums` each converted
/// row's sum, in `order`, and with `counters` fold counters zeroed for the kernel after it.
fn hand_over(
    g: &TrellisGeometry,
    m: usize,
    dtype: Dtype,
    row_sums: bool,
    order: HandOverOrder,
    counters: usize,
) -> Result<CudaLaunch> {
    let (output, width) = (PrePassOutput::Activations, g.in_features());
    let wgmma_order = matches!(order, HandOverOrder::Wgmma);
    let image_rows = if let HandOverOrder::Image(rows) = order { rows } else { 0 };
    let pre_pass = PrePass {
        m,
        width,
        row_pad: width,
        dtype,
        counters,
        row_scales: false,
        output,
        pair: false,
        row_sums,
        wgmma_order,
        image_rows,
    };
    pre_pass.prepare()
}

/// The GEMMs' launch (`gate_up_gemm.cu`, `gate_up_wgmma.cu`): a thread block of
/// `cfg.warps / (cfg.split_k cfg.row_split)` 16-row output tiles per pass of `cfg.pass_rows()`
/// rows, its dynamic shared memory, and the pre-pass that hands the `m` rows of `dtype`
/// activations over as f16 (in the warpgroup GEMM's order for it).
fn prepared_gemm_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    passes: usize,
) -> Result<Prepared> {
    // Output tiles a block: the GEMM's split_k or row_split warps share one (the warpgroup GEMM
    // has neither).
    let tiles = (cfg.warps / (cfg.split_k * cfg.row_split)) as usize;
    let blocks = g.out_features().div_ceil(16 * tiles);
    let wgmma = cfg.kernel == AxisOneKernel::Wgmma;
    let launch = base_launch(g, cfg, m, dtype, variant, [blocks, passes])
        .template_int("MT", cfg.mt as i32)
        .template_bool("BIAS_FOLD", cfg.bias_fold);
    let (launch, shared) = if wgmma {
        (launch, cfg.wgmma_shared_bytes())
    } else {
        (
            launch
                .template_bool("PREFETCH", cfg.prefetch)
                .template_int("SPLIT_K", cfg.split_k as i32)
                .template_int("ROW_SPLIT", cfg.row_split as i32),
            cfg.gemm_shared_bytes(matches!(variant, Variant::Fused { .. })),
        )
    };
    let kernel = kernel(variant, cfg.kernel, shared, None)?;
    // The rows' sums only where the kernel folds the bias: otherwise x_sum is a placeholder.
    let order = if wgmma { HandOverOrder::Wgmma } else { HandOverOrder::Natural };
    let hand_over = Some(hand_over(g, m, dtype, cfg.bias_fold, order, 0)?);
    Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, kernel_kind: cfg.kernel, hand_over })
}

/// The warp-specialized GEMM's launch (`gate_up_ws.cu`): `cfg.ctas` thread blocks of a consumer
/// warpgroup and four producer warps a matrix for each of `passes` passes of `8 cfg.mt` rows,
/// bounded to one block an SM, its dynamic shared memory, its scratch for the parts of tiles its
/// blocks share, and the pre-pass that hands the `m` rows of `dtype` activations over as f16 in
/// the image order of its stages and zeroes a fold counter for each 64-row tile of each pass.
fn prepared_ws_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    passes: usize,
) -> Result<Prepared> {
    let fused = matches!(variant, Variant::Fused { .. });
    let what = "CUDA axis-1 warp-specialized GEMM";
    let tiles = g.out_features().div_ceil(64);
    let accumulators = if fused { 2 } else { 1 } * cfg.mt as usize * 4;
    let (Some(counters), Some(partials)) = (
        tiles.checked_mul(passes),
        passes.checked_mul(cfg.ctas as usize).and_then(|n| n.checked_mul(2 * 128 * accumulators)),
    ) else {
        invalid!("{what}: {m} rows of {g} overflow the launch's sizes");
    };
    if i32::try_from(counters).is_err() || i32::try_from(partials).is_err() {
        invalid!("{what}: {m} rows of {g} overflow the launch's sizes ({counters} counters, {partials} partial sums)");
    }
    let launch = base_launch(g, cfg, m, dtype, variant, [cfg.ctas as usize, passes])
        .output(&[partials], Dtype::Float32)
        .template_int("MT", cfg.mt as i32)
        .template_int("STAGES", cfg.stages as i32)
        .template_bool("BIAS_FOLD", cfg.bias_fold);
    let bounds = LaunchBounds { threads: 32 * cfg.warps, min_blocks: 1 };
    let kernel = kernel(variant, cfg.kernel, cfg.ws_shared_bytes(fused), Some(bounds))?;
    let hand_over = Some(hand_over(g, m, dtype, cfg.bias_fold, HandOverOrder::Image(cfg.pass_rows()), counters)?);
    Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, kernel_kind: cfg.kernel, hand_over })
}

/// What the three kernels' launches share: thread blocks of `cfg.warps` warps over `grid` (y, z),
/// `m` rows of output in `dtype`, and the template arguments of the output (Y), the code (K, L,
/// and KU in the fused variant) and the warps (WARPS).
fn base_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    [grid_y, grid_z]: [usize; 2],
) -> LaunchConfig {
    let threads = 32 * cfg.warps as usize;
    let launch = LaunchConfig::new([threads, grid_y, grid_z], [threads, 1, 1])
        .output(&[m, g.out_features()], dtype)
        .template_dtype("Y", dtype)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("WARPS", cfg.warps as i32);
    match variant {
        Variant::Fused { up_bits, feed: 0 } => launch.template_int("KU", up_bits as i32),
        Variant::Fused { up_bits, feed } => launch
            .output(&[feed as usize], Dtype::Uint32)
            .template_int("KU", up_bits as i32)
            .template_int("COUNTERS", feed as i32),
        _ => launch,
    }
}

/// What the fragment and int8 kernels' launches add: a thread block per row tile and pass
/// (`grid`), the activations read in `read` (T) and the row tiles (RT).
fn common_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    read: Dtype,
    dtype: Dtype,
    variant: Variant,
    grid: [usize; 2],
) -> LaunchConfig {
    base_launch(g, cfg, m, dtype, variant, grid).template_dtype("T", read).template_int("RT", cfg.rt as i32)
}

/// The int8 kernel's launch: `m` rows (its template int `R`) of `dtype`
/// activations read as they are, a thread block per row tile.
fn prepared_int8_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    row_tiles: usize,
) -> Result<Prepared> {
    if !(1..=INT8_MAX_ROWS).contains(&m) {
        invalid!("CUDA axis-1 kernel: int8 activations take 1 to {INT8_MAX_ROWS} rows (got {m})");
    }
    let fused = matches!(variant, Variant::Fused { .. });
    let Some(shared) = cfg.int8_shared_bytes(m, g.in_features(), fused) else {
        invalid!(
            "CUDA axis-1 kernel: int8 tables of {m} rows of {} inputs exceed the shared memory a thread block may take",
            g.in_features()
        );
    };
    let launch = common_launch(g, cfg, m, dtype, dtype, variant, [row_tiles, 1]).template_int("R", m as i32);
    // STAGED_RESIDENT_WARPS 0: no bounds, as for the staged fragment kernel.
    let bounds = (STAGED_RESIDENT_WARPS > 0)
        .then(|| LaunchBounds { threads: 32 * cfg.warps, min_blocks: cfg.int8_resident_blocks(shared) });
    let kernel = kernel(variant, AxisOneKernel::Int8, shared, bounds)?;
    Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, kernel_kind: AxisOneKernel::Int8, hand_over: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trellis::cuda::gate_up::plan::plan;
    #[test]
    fn each_variant_registers_only_its_own_sections() {
        let kernels = [
            AxisOneKernel::Fragment,
            AxisOneKernel::Int8,
            AxisOneKernel::Gemm,
            AxisOneKernel::Wgmma,
            AxisOneKernel::Specialized,
        ];
        for kernel in kernels {
            let int8 = kernel == AxisOneKernel::Int8;
            // Registered compacted: comments (which name both variants) are gone.
            let compact = |v: Variant| crate::kernel::compact::compact_plain_cpp(&v.source(kernel).unwrap()).unwrap();
            let (single, fused) = (compact(Variant::Single), compact(Variant::Fused { up_bits: 3, feed: 0 }));
            let residual = compact(Variant::Residual);
            assert!(fused.contains("up_codes") && !single.contains("up_codes") && !residual.contains("up_codes"));
            assert!(
                fused.contains("silu_times(") && !single.contains("silu_times(") && !residual.contains("silu_times(")
            );
            assert!(residual.contains("residual[") && !single.contains("residual[") && !fused.contains("residual["));
            for text in [&single, &fused, &residual] {
                assert!(
                    !text.contains("TRELLIS_FUSED") && !text.contains("TRELLIS_RESIDUAL"),
                    "the flags' directives are cut"
                );
                assert_eq!(text.contains("mma_u8s8"), int8, "{kernel:?}");
                let ws = kernel == AxisOneKernel::Specialized;
                // The GEMMs stage their activations with cp.async, the warp-specialized GEMM
                // with bulk copies (stream_k.cuh's ActivationRing).
                let gemm = matches!(kernel, AxisOneKernel::Gemm | AxisOneKernel::Wgmma);
                assert_eq!(text.contains("cp_async16_zfill"), gemm, "{kernel:?}");
                assert_eq!(text.contains("ActivationRing<"), ws, "{kernel:?}");
                assert_eq!(text.contains("wgmma_rs"), kernel == AxisOneKernel::Wgmma, "{kernel:?}");
                assert_eq!(text.contains("wgmma_ss"), ws, "{kernel:?}");
                // The int8 kernel reads no row exponents, and its inputs say so.
                assert_eq!(text.contains("x_exp"), !int8, "{kernel:?}");
                // Only the warp-specialized GEMM folds its own tiles' parts, on counters and
                // partial sums of its inputs and outputs.
                assert_eq!(text.contains("counters"), ws, "{kernel:?}");
                assert_eq!(text.contains("partials"), ws, "{kernel:?}");
            }
            // The variant that zeroes the down kernel's counters is the fragment kernel's and the
            // GEMM's.
            let feed = Variant::Fused { up_bits: 3, feed: 40 };
            match kernel {
                AxisOneKernel::Fragment | AxisOneKernel::Gemm => {
                    let text = compact(feed);
                    assert!(
                        text.contains("counters[") && text.contains("silu_times(") && !text.contains("TRELLIS_FEED")
                    );
                    assert_eq!(feed.outputs(kernel), ["y", "counters"]);
                }
                _ => assert!(feed
                    .source(kernel)
                    .unwrap_err()
                    .to_string()
                    .contains("only the fragment kernel and the GEMM")),
            }
            for v in [Variant::Single, Variant::Residual, Variant::Fused { up_bits: 2, feed: 0 }] {
                assert_eq!(v.inputs(kernel).contains(&"x_exp"), !int8);
                assert_eq!(v.inputs(kernel).contains(&"counters"), kernel == AxisOneKernel::Specialized);
                let outputs: &[&str] = if kernel == AxisOneKernel::Specialized { &["y", "partials"] } else { &["y"] };
                assert_eq!(v.outputs(kernel), outputs, "{kernel:?}");
            }
        }
    }

    #[test]
    fn staged_kernels_are_bounded_for_the_warps_they_launch() {
        let staged = plan(1, Dtype::Bfloat16, true, 17408);
        assert!(staged.stage && staged.warps == 4, "{staged:?}");
        // Five 4-warp blocks an SM: 20 warps of at most 96 registers.
        assert_eq!(staged_bounds(staged, 20_000), Some(LaunchBounds { threads: 128, min_blocks: 5 }));
        assert_eq!(STAGED_RESIDENT_WARPS, 20);
        // Other warp counts keep the launch's threads; the same warps an SM where they divide it.
        for (warps, min_blocks) in [(1, 20), (2, 10), (3, 6), (8, 2)] {
            let bounds = staged_bounds(AxisOneConfig { warps, ..staged }, 20_000).unwrap();
            assert_eq!((bounds.threads, bounds.min_blocks), (32 * warps, min_blocks));
        }
        // Rows read from global memory: no bounds, the kernel as before.
        assert_eq!(staged_bounds(staged, 0), None);
    }

    #[test]
    fn int8_calls_outside_its_kernel_are_errors_that_say_so() {
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let cfg = AxisOneConfig { rt: 2, ..AxisOneConfig::plain(AxisOneKernel::Int8) };
        let err = prepared_launch(&up, cfg, 9, Dtype::Bfloat16, Variant::Single).err().expect("9 rows");
        assert!(err.to_string().contains("int8 activations take 1 to 8 rows (got 9)"), "{err}");
        // 4 rows of 8192 inputs: 275 KB of tables.
        let wide = TrellisGeometry::row_major(256, 8192, 3, 256, 12, 1).unwrap();
        let err = prepared_launch(&wide, cfg, 4, Dtype::Bfloat16, Variant::Single).err().expect("wide");
        assert!(err.to_string().contains("int8 tables of 4 rows of 8192 inputs exceed"), "{err}");
        // The plan never takes it.
        assert_eq!(plan(1, Dtype::Bfloat16, true, 256).kernel, AxisOneKernel::Fragment);
    }

    #[test]
    fn a_grid_past_cudas_limits_is_an_error_that_says_so() {
        // Caught while the launch is prepared, before anything runs (so on every back-end).
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let cfg = AxisOneConfig::plain(AxisOneKernel::Fragment);
        // 8 rows a pass: 65536 passes are one more than grid z holds.
        let err = prepared_launch(&up, cfg, 8 * 65536, Dtype::Float32, Variant::Single).err().expect("65536 passes");
        let err = err.to_string();
        assert!(err.contains("too many for one launch grid") && err.contains("65536 passes"), "{err}");
    }
}
