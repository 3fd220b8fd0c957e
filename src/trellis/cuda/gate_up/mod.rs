//! Axis-1 projections on MLX's CUDA back-end (`kernels/cuda/gate_up.cu`): one coded projection
//! stored `[out, in]` ([`linear`]), or an MLP's gate and up projections of the same rows fused
//! with the SwiGLU ([`swiglu`]: `silu(x · Wg) ⊙ (x · Wu)`). Either is one launch that writes the
//! output in the activation dtype: the reduction runs inside each output row, so no partial
//! sums and no fold.
//!
//! [`linear_residual`] adds a residual stream to one projection's output in the same launch
//! (`residual + x · W`, rounded once): a model's down projection and its residual add.
//!
//! Three kernel files serve the same variants ([`AxisOneKernel`](plan::AxisOneKernel)); the
//! plan (`plan.rs`) picks the kernel and its shape for a row count, and each kernel file says how
//! its work is split:
//! - `gate_up.cu`, the fragment kernel: the warps of a thread block split a row's blocks, each
//!   lane reads its own activations. One row up to the GEMM's threshold, and f32 activations.
//! - `gate_up_gemm.cu`, the decode-once GEMM: the warps own different output tiles and share
//!   the activations, staged in shared memory. From `GEMM_MIN_ROWS` rows of 16-bit activations,
//!   handed over as f16 by the pre-pass (`prescale.cu`).
//! - `gate_up_int8.cu` (the tuning feature only): up to 8 rows of 16-bit activations as two int8
//!   terms on u8 x s8 MMAs; not planned, as it measured no faster.
//!
//! From [`CONVERT_MIN_ROWS`] rows, bf16 activations are handed to the fragment kernel as f16,
//! each row multiplied by a power of two into f16's range (one pre-pass launch per call instead
//! of a conversion per row tile of the layer); from [`DENSE_MIN_ROWS`] rows of 16-bit activations
//! the layer is decoded once to dense weights for MLX's matmul instead.

// The shape and its plan (public with the `tuning` feature, for the sweeps and tests that call the
// kernel with a shape of their own; crate-private otherwise), as Metal's families.
crate::tuning_mods! {
    plan;
}

use std::sync::Arc;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, unserved, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::sources;
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::checks::{check_operands, same_but_bits};
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::operands::LayerOperands;

use super::expand::expand_cuda;
use super::prescale::{self, PrePass, PrePassOutput};
use plan::{plan, AxisOneConfig, AxisOneKernel, INT8_MAX_ROWS};

/// Rows of bf16 activations from which the kernel reads them as f16, converted once per call by
/// the pre-pass (each row brought into f16's range by a power of two): every row tile of the
/// layer converts its fragments again otherwise.
pub const CONVERT_MIN_ROWS: usize = 17;

/// Rows of 16-bit activations from which [`linear`] and [`swiglu`] decode the layer to dense
/// weights ([`expand_cuda`]) and run MLX's matmul: the GEMM decodes every weight once per pass of
/// up to 64 rows, the dense path once per call. On an H200 in Qwen3-14B's MLP chain the GEMM's
/// two passes at 128 rows lost to the dense path (docs/cuda-mlp.md).
pub const DENSE_MIN_ROWS: usize = 65;

/// Whether `m` rows of `dtype` activations take the dense path.
pub fn uses_dense(m: usize, dtype: Dtype) -> bool {
    m >= DENSE_MIN_ROWS && dtype != Dtype::Float32
}

/// Whether the kernel serves `g`: axis 1, row-major codes, T = 256, L <= 16, k in 2..=4 (the
/// widths it is tested at against the reference; wider codes are refused as unserved).
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 1 && g.layout() == CodeLayout::RowMajor && g.t == 256 && g.l <= 16 && (2..=4).contains(&g.k)
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer.
pub fn linear(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, codes, scales, g)?;
    if uses_dense(m, x2.dtype()) {
        return x2.matmul(&expand_cuda(codes, scales, g, x2.dtype())?.t()?);
    }
    run_linear(x2, codes, scales, g, m, plan(m, x2.dtype(), false, g.out_features()), None)
}

/// `residual + x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer: [`linear`] with
/// the add in the same launch, in f32 before the output is rounded (one rounding where
/// [`linear`] and an add round twice). `residual` is `[M, out]` in `x2`'s dtype. From
/// [`DENSE_MIN_ROWS`] rows of 16-bit activations, MLX's matmul and add.
pub fn linear_residual(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
) -> Result<MlxArray> {
    residual_call(x2, codes, scales, g, residual, None)
}

/// [`linear_residual`] with an explicit shape and never the dense path (the `tuning` feature's
/// `axis_one_residual_with`).
#[cfg(feature = "tuning")]
pub fn linear_residual_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    residual_call(x2, codes, scales, g, residual, Some(cfg))
}

/// [`linear_residual`] by `cfg`, or (`None`) by the plan or the dense path.
fn residual_call(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    residual: &MlxArray,
    cfg: Option<AxisOneConfig>,
) -> Result<MlxArray> {
    let what = "CUDA axis-1 kernel with a residual";
    let m = check(what, x2, codes, scales, g)?;
    let (shape, dtype) = (residual.shape(), residual.dtype());
    if shape != [m, g.out_features()] || dtype != x2.dtype() {
        invalid!(
            "{what}: residual {dtype} {shape:?} must be {} [{m}, {}], as the output",
            x2.dtype(),
            g.out_features()
        );
    }
    let cfg = match cfg {
        Some(cfg) => cfg,
        None if uses_dense(m, x2.dtype()) => return residual.add(&linear(x2, codes, scales, g)?),
        None => plan(m, x2.dtype(), false, g.out_features()),
    };
    run_linear(x2, codes, scales, g, m, cfg, Some(residual))
}

/// [`linear`] with an explicit shape (the `tuning` feature's `axis_one_with`).
#[cfg(feature = "tuning")]
pub(crate) fn linear_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, codes, scales, g)?;
    run_linear(x2, codes, scales, g, m, cfg, None)
}

/// The single projection's launch on checked operands of `m` rows, with the residual variant
/// where `residual` is given (checked by the caller).
fn run_linear(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    m: usize,
    cfg: AxisOneConfig,
    residual: Option<&MlxArray>,
) -> Result<MlxArray> {
    let read = read_dtype(x2, m, cfg.kernel);
    let variant = if residual.is_some() { Variant::Residual } else { Variant::Single };
    let prepared = prepared_launch(g, cfg, m, read, x2.dtype(), variant)?;
    let (x, x_exp) = prepared.kernel_input(x2, scales)?;
    let mut inputs =
        if cfg.kernel == AxisOneKernel::Int8 { vec![&x, codes, scales] } else { vec![&x, &x_exp, codes, scales] };
    inputs.extend(residual);
    Ok(prepared.kernel.apply_prepared(&inputs, &prepared.launch)?.remove(0))
}

/// Whether the fused kernel serves gate `gate` with up `up`: both served ([`supports`]) and of
/// the same rows, inputs, T, L and layout; their bit widths may differ (artifacts that allocate
/// bits per tensor).
pub fn fuses(gate: &TrellisGeometry, up: &TrellisGeometry) -> bool {
    supports(gate) && supports(up) && same_but_bits(gate, up)
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, intermediate]` in `x2`'s dtype: the gate and up projections
/// of the same rows in one launch, gate and up of the same or different bit widths ([`fuses`]).
/// `gate` and `up` are their operands (a [`TrellisLinear`](crate::trellis::TrellisLinear)
/// reference gives its own).
pub fn swiglu<'g, 'u>(
    x2: &MlxArray,
    gate: impl Into<LayerOperands<'g>>,
    up: impl Into<LayerOperands<'u>>,
) -> Result<MlxArray> {
    let (gate, up) = (gate.into(), up.into());
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) && fuses(gate.geometry, up.geometry) {
        let g = linear(x2, gate.codes, gate.scales, gate.geometry)?;
        let u = linear(x2, up.codes, up.scales, up.geometry)?;
        return g.silu()?.multiply(&u);
    }
    swiglu_with(x2, gate, up, plan(m, x2.dtype(), true, gate.geometry.out_features()))
}

/// [`swiglu`] with an explicit shape (also the `tuning` feature's `swiglu_with`).
pub(crate) fn swiglu_with(
    x2: &MlxArray,
    gate: LayerOperands<'_>,
    up: LayerOperands<'_>,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    let (g, ug) = (gate.geometry, up.geometry);
    let what = "CUDA gate·up kernel";
    if !same_but_bits(g, ug) {
        unserved!("{what}: gate {g} and up {ug} differ in more than their bit widths; the fused kernel needs the same rows, inputs, T, L and layout");
    }
    let m = check(what, x2, gate.codes, gate.scales, g)?;
    check(&format!("{what} (up projection)"), x2, up.codes, up.scales, ug)?;
    let read = read_dtype(x2, m, cfg.kernel);
    let prepared = prepared_launch(g, cfg, m, read, x2.dtype(), Variant::Fused { up_bits: ug.k })?;
    let (x, x_exp) = prepared.kernel_input(x2, gate.scales)?;
    let inputs: &[&MlxArray] = if cfg.kernel == AxisOneKernel::Int8 {
        &[&x, gate.codes, gate.scales, up.codes, up.scales]
    } else {
        &[&x, &x_exp, gate.codes, gate.scales, up.codes, up.scales]
    };
    Ok(prepared.kernel.apply_prepared(inputs, &prepared.launch)?.remove(0))
}

/// Checks the call: a served geometry, then the operands (`x2 [M >= 1, in]` in f32/f16/bf16,
/// the codes and scales in `g`'s shapes). Returns `M`.
fn check(what: &str, x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<usize> {
    if !supports(g) {
        unserved!(
            "{what}: unsupported geometry {g} (needs axis 1, row-major codes, T 256, L <= 16, k 2..=4; k 5..8 are untested on this kernel)"
        );
    }
    check_operands(what, x2, codes, scales, g)
}

/// The dtype `kernel` reads `m` rows of `x2` in: the GEMM always the pre-pass's f16; the others
/// bf16 as the pre-pass's f16 from [`CONVERT_MIN_ROWS`] rows, else as given.
fn read_dtype(x2: &MlxArray, m: usize, kernel: AxisOneKernel) -> Dtype {
    if kernel == AxisOneKernel::Gemm || (x2.dtype() == Dtype::Bfloat16 && m >= CONVERT_MIN_ROWS) {
        Dtype::Float16
    } else {
        x2.dtype()
    }
}

/// The variant of the kernel file a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Variant {
    /// One projection.
    Single,
    /// One projection plus a residual (the `TRELLIS_RESIDUAL` sections).
    Residual,
    /// Gate and up with the SwiGLU (the `TRELLIS_FUSED` sections); the up projection's k.
    Fused { up_bits: u32 },
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Single => "single",
            Variant::Residual => "residual",
            Variant::Fused { .. } => "fused",
        }
    }

    /// The kernel's inputs, in `apply` order (the int8 kernel reads no row exponents).
    fn inputs(self, kernel: AxisOneKernel) -> &'static [&'static str] {
        let all: &'static [&'static str] = match self {
            Variant::Single => &["x", "x_exp", "codes", "scales"],
            Variant::Residual => &["x", "x_exp", "codes", "scales", "residual"],
            Variant::Fused { .. } => &["x", "x_exp", "codes", "scales", "up_codes", "up_scales"],
        };
        if kernel != AxisOneKernel::Int8 {
            return all;
        }
        match self {
            Variant::Single => &["x", "codes", "scales"],
            Variant::Residual => &["x", "codes", "scales", "residual"],
            Variant::Fused { .. } => &["x", "codes", "scales", "up_codes", "up_scales"],
        }
    }

    /// The variant's text: `kernel`'s file with the variant's own sections only.
    fn source(self, kernel: AxisOneKernel) -> Result<String> {
        let (text, file) = kernel_file(kernel);
        let fused = source_variant(text, "TRELLIS_FUSED", matches!(self, Variant::Fused { .. }));
        fused
            .and_then(|text| source_variant(&text, "TRELLIS_RESIDUAL", self == Variant::Residual))
            .with_context(|| format!("CUDA axis-1 kernel source {file}"))
    }
}

/// `kernel`'s file: its text and its name.
fn kernel_file(kernel: AxisOneKernel) -> (&'static str, &'static str) {
    match kernel {
        AxisOneKernel::Fragment => (sources::CUDA_GATE_UP, "gate_up.cu"),
        AxisOneKernel::Int8 => (sources::CUDA_GATE_UP_INT8, "gate_up_int8.cu"),
        AxisOneKernel::Gemm => (sources::CUDA_GATE_UP_GEMM, "gate_up_gemm.cu"),
    }
}

/// `kernel`'s `variant`, registered with `shared` bytes of dynamic shared memory (the int8
/// kernel's and the GEMM's; none for the fragment kernel).
fn kernel(variant: Variant, kernel: AxisOneKernel, shared: usize) -> Result<&'static CudaKernel> {
    let family = match kernel {
        AxisOneKernel::Fragment => "gate_up",
        AxisOneKernel::Int8 => "gate_up_int8",
        AxisOneKernel::Gemm => "gate_up_gemm",
    };
    let key = KernelKey { family, variant: variant.name(), shared_memory: shared };
    registry::cuda(key, || {
        let mut header = vec![sources::CUDA_CODEBOOK, sources::CUDA_FRAGMENT, sources::CUDA_AXIS_ONE];
        if kernel == AxisOneKernel::Int8 {
            header.push(sources::CUDA_GATE_UP_INT8_HEADER);
        }
        Ok(KernelText {
            inputs: variant.inputs(kernel),
            outputs: &["y"],
            body: variant.source(kernel)?,
            header: header.join("\n"),
        })
    })
}

/// One call's kernel and launch, prepared once per geometry, shape, row count, dtype and variant
/// (and the up projection's bit width in the fused one), with the pre-pass that hands bf16
/// activations over as f16 where the kernel reads them so.
struct Prepared {
    kernel: &'static CudaKernel,
    launch: CudaLaunch,
    hand_over: Option<CudaLaunch>,
}

impl Prepared {
    /// The kernel's `x` and `x_exp` inputs for `x2`: the pre-pass's f16 activations and their
    /// rows' exponents, or `x2` itself with `placeholder` (any f16 array) as `x_exp`, which the
    /// kernel then does not read.
    fn kernel_input(&self, x2: &MlxArray, placeholder: &MlxArray) -> Result<(MlxArray, MlxArray)> {
        match &self.hand_over {
            Some(launch) => {
                let mut outs = prescale::kernel(false)?
                    .apply_prepared(&[x2, placeholder], launch)
                    .context("CUDA axis-1 kernel: the activations handed over as f16")?;
                let x_exp = outs.pop().expect("three outputs");
                outs.pop();
                Ok((outs.pop().expect("three outputs"), x_exp))
            }
            None => Ok((x2.clone(), placeholder.clone())),
        }
    }
}

/// `read` is the dtype the kernel reads the activations in, `dtype` the output's. `g` is the
/// gate's (or the only) geometry.
fn prepared_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    read: Dtype,
    dtype: Dtype,
    variant: Variant,
) -> Result<Arc<Prepared>> {
    type Key = (TrellisGeometry, AxisOneConfig, usize, Dtype, Dtype, Variant);
    static LAUNCHES: LaunchCache<Key, Prepared> = LaunchCache::new(1024);
    let fused = matches!(variant, Variant::Fused { .. });
    LAUNCHES.get_or_build((*g, cfg, m, read, dtype, variant), || {
        cfg.check(dtype, fused)?;
        let outputs = g.out_features();
        let row_tiles = outputs.div_ceil(16 * cfg.rt as usize);
        let passes = m.div_ceil(8 * cfg.mt as usize);
        // Grid y holds the row tiles, z the passes (CUDA's y and z are at most 65535).
        if row_tiles > 65535 || passes > 65535 {
            invalid!("CUDA axis-1 kernel: {m} rows of {g} are too many for one launch grid ({row_tiles} row tiles by {passes} passes; at most 65535 each)");
        }
        match cfg.kernel {
            AxisOneKernel::Int8 => return prepared_int8_launch(g, cfg, m, dtype, variant, row_tiles),
            AxisOneKernel::Gemm => return prepared_gemm_launch(g, cfg, m, dtype, variant, passes),
            AxisOneKernel::Fragment => {}
        }
        let sixteen_bit = dtype != Dtype::Float32;
        let launch = common_launch(g, cfg, m, read, dtype, variant, [row_tiles, passes])
            .template_int("MT", cfg.mt as i32)
            .template_bool("SPLIT_X", !sixteen_bit)
            .template_bool("BIAS_FOLD", cfg.bias_fold && sixteen_bit)
            .template_bool("PACK_FMA", cfg.pack_fma && cfg.bias_fold && sixteen_bit)
            // Rows' powers of two: found by the kernel for bf16 and f32 read as they are, given
            // by the pre-pass for handed-over activations, none for f16 (see gate_up.cu).
            .template_bool("LIFT", read != Dtype::Float16)
            .template_bool("HANDED", read != dtype);
        let kernel = kernel(variant, AxisOneKernel::Fragment, 0)?;
        let hand_over = if read != dtype { Some(hand_over(g, m, dtype)?) } else { None };
        Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, hand_over })
    })
}

/// The pre-pass that hands `m` rows of `dtype` activations of `g`'s inputs over as f16, each row
/// multiplied by its power of two (`prescale.cu`, no scales).
fn hand_over(g: &TrellisGeometry, m: usize, dtype: Dtype) -> Result<CudaLaunch> {
    let (output, width) = (PrePassOutput::Activations, g.in_features());
    PrePass { m, width, row_pad: width, dtype, counters: 0, row_scales: false, output, pair: false }.prepare()
}

/// The GEMM's launch (`gate_up_gemm.cu`): a thread block of `cfg.warps` 16-row output tiles per
/// pass of `8 cfg.mt` rows, its dynamic shared memory, and the pre-pass that hands the `m` rows
/// of `dtype` activations over as f16.
fn prepared_gemm_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    dtype: Dtype,
    variant: Variant,
    passes: usize,
) -> Result<Prepared> {
    let threads = 32 * cfg.warps as usize;
    let blocks = g.out_features().div_ceil(16 * cfg.warps as usize);
    let launch = LaunchConfig::new([threads, blocks, passes], [threads, 1, 1])
        .output(&[m, g.out_features()], dtype)
        .template_dtype("Y", dtype)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("MT", cfg.mt as i32)
        .template_int("WARPS", cfg.warps as i32);
    let launch = match variant {
        Variant::Fused { up_bits } => launch.template_int("KU", up_bits as i32),
        _ => launch,
    };
    let kernel = kernel(variant, AxisOneKernel::Gemm, cfg.gemm_shared_bytes())?;
    Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, hand_over: Some(hand_over(g, m, dtype)?) })
}

/// What both axis-1 kernels' launches share: a thread block per row tile and pass (`grid`), `m`
/// rows of output in `dtype`, the activations read in `read`, and the template arguments of the
/// code (K, L, and KU in the fused variant) and of the shape (RT, WARPS).
fn common_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    read: Dtype,
    dtype: Dtype,
    variant: Variant,
    [row_tiles, passes]: [usize; 2],
) -> LaunchConfig {
    let threads = 32 * cfg.warps as usize;
    let launch = LaunchConfig::new([threads, row_tiles, passes], [threads, 1, 1])
        .output(&[m, g.out_features()], dtype)
        .template_dtype("T", read)
        .template_dtype("Y", dtype)
        .template_int("K", g.k as i32)
        .template_int("L", g.l as i32)
        .template_int("RT", cfg.rt as i32)
        .template_int("WARPS", cfg.warps as i32);
    match variant {
        Variant::Fused { up_bits } => launch.template_int("KU", up_bits as i32),
        _ => launch,
    }
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
    let kernel = kernel(variant, AxisOneKernel::Int8, shared)?;
    Ok(Prepared { kernel, launch: kernel.prepare(&launch)?, hand_over: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variant_registers_only_its_own_sections() {
        for kernel in [AxisOneKernel::Fragment, AxisOneKernel::Int8, AxisOneKernel::Gemm] {
            let int8 = kernel == AxisOneKernel::Int8;
            // Registered compacted: comments (which name both variants) are gone.
            let compact = |v: Variant| crate::kernel::compact::compact_plain_cpp(&v.source(kernel).unwrap()).unwrap();
            let (single, fused) = (compact(Variant::Single), compact(Variant::Fused { up_bits: 3 }));
            let residual = compact(Variant::Residual);
            assert!(fused.contains("up_codes") && !single.contains("up_codes") && !residual.contains("up_codes"));
            assert!(fused.contains("__expf") && !single.contains("__expf") && !residual.contains("__expf"));
            assert!(residual.contains("residual[") && !single.contains("residual[") && !fused.contains("residual["));
            for text in [&single, &fused, &residual] {
                assert!(
                    !text.contains("TRELLIS_FUSED") && !text.contains("TRELLIS_RESIDUAL"),
                    "the flags' directives are cut"
                );
                assert_eq!(text.contains("mma_u8s8"), int8, "{kernel:?}");
                assert_eq!(text.contains("cp_async16_zfill"), kernel == AxisOneKernel::Gemm, "{kernel:?}");
                // The int8 kernel reads no row exponents, and its inputs say so.
                assert_eq!(text.contains("x_exp"), !int8, "{kernel:?}");
            }
            for v in [Variant::Single, Variant::Residual, Variant::Fused { up_bits: 2 }] {
                assert_eq!(v.inputs(kernel).contains(&"x_exp"), !int8);
            }
        }
    }

    #[test]
    fn int8_calls_outside_its_kernel_are_errors_that_say_so() {
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let cfg = AxisOneConfig { rt: 2, ..AxisOneConfig::plain(AxisOneKernel::Int8) };
        let err =
            prepared_launch(&up, cfg, 9, Dtype::Bfloat16, Dtype::Bfloat16, Variant::Single).err().expect("9 rows");
        assert!(err.to_string().contains("int8 activations take 1 to 8 rows (got 9)"), "{err}");
        // 4 rows of 8192 inputs: 275 KB of tables.
        let wide = TrellisGeometry::row_major(256, 8192, 3, 256, 12, 1).unwrap();
        let err =
            prepared_launch(&wide, cfg, 4, Dtype::Bfloat16, Dtype::Bfloat16, Variant::Single).err().expect("wide");
        assert!(err.to_string().contains("int8 tables of 4 rows of 8192 inputs exceed"), "{err}");
        // The plan never takes it.
        assert_eq!(plan(1, Dtype::Bfloat16, true, 256).kernel, AxisOneKernel::Fragment);
    }

    #[test]
    fn unserved_geometries_and_bad_activations_are_refused() {
        let down = TrellisGeometry::row_major(512, 256, 3, 256, 12, 0).unwrap();
        let x = MlxArray::zeros(&[2, 512], Dtype::Float32).unwrap();
        let codes = MlxArray::zeros(&down.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[512], Dtype::Float16).unwrap();
        let err = linear(&x, &codes, &scales, &down).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unserved, "{err}");
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let codes = MlxArray::zeros(&up.codes_shape(), Dtype::Uint32).unwrap();
        let scales = MlxArray::zeros(&[256], Dtype::Float16).unwrap();
        let wide = MlxArray::zeros(&[2, 256], Dtype::Float32).unwrap();
        let err = linear(&wide, &codes, &scales, &up).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("[M >= 1, 512]"), "{err}");
        let ints = MlxArray::zeros(&[2, 512], Dtype::Int32).unwrap();
        assert_eq!(linear(&ints, &codes, &scales, &up).unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
    }

    #[test]
    fn codes_wider_than_the_tested_widths_are_unserved_naming_them() {
        for k in [5, 6, 8] {
            let up = TrellisGeometry::row_major(256, 512, k, 256, 16, 1).unwrap();
            assert!(!supports(&up));
            let x = MlxArray::zeros(&[2, 512], Dtype::Float32).unwrap();
            let codes = MlxArray::zeros(&up.codes_shape(), Dtype::Uint32).unwrap();
            let scales = MlxArray::zeros(&[256], Dtype::Float16).unwrap();
            let err = linear(&x, &codes, &scales, &up).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Unserved, "{err}");
            assert!(err.to_string().contains("k 2..=4; k 5..8 are untested"), "{err}");
        }
    }

    #[test]
    fn a_grid_past_cudas_limits_is_an_error_that_says_so() {
        // Caught while the launch is prepared, before anything runs (so on every back-end).
        let up = TrellisGeometry::row_major(256, 512, 3, 256, 12, 1).unwrap();
        let cfg = AxisOneConfig::plain(AxisOneKernel::Fragment);
        // 8 rows a pass: 65536 passes are one more than grid z holds.
        let err = prepared_launch(&up, cfg, 8 * 65536, Dtype::Float32, Dtype::Float32, Variant::Single)
            .err()
            .expect("65536 passes");
        let err = err.to_string();
        assert!(err.contains("too many for one launch grid") && err.contains("65536 passes"), "{err}");
    }
}
