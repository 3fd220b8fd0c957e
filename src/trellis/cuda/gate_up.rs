//! Axis-1 projections on MLX's CUDA back-end (`kernels/cuda/gate_up.cu`): one coded projection
//! stored `[out, in]` ([`linear`]), or an MLP's gate and up projections of the same rows fused
//! with the SwiGLU ([`swiglu`]: `silu(x · Wg) ⊙ (x · Wu)`). Either is one launch that writes the
//! output in the activation dtype: the reduction runs inside each output row, so no partial
//! sums and no fold.
//!
//! [`plan`] picks the kernel's shape for a row count; the kernel file says how the work is split.
//! From [`CONVERT_MIN_ROWS`] rows, bf16 activations are handed to the kernel as f16 (one MLX
//! conversion per call instead of one per row tile of the layer); from [`DENSE_MIN_ROWS`] rows of
//! 16-bit activations the layer is decoded once to dense weights for MLX's matmul instead.

use std::sync::OnceLock;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, unserved, ErrorContext, Result};
use crate::kernel::registry::{self, KernelKey, KernelText, LaunchCache};
use crate::kernel::variant::source_variant;
use crate::kernel::{CudaKernel, CudaLaunch, LaunchConfig};
use crate::trellis::format::codebook::CUDA_HEADER;
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::linear::TrellisLinear;

use super::dense::expand_cuda;

/// Rows of bf16 activations from which the kernel reads them as f16, converted by MLX once per
/// call: every row tile of the layer converts its fragments again otherwise.
pub const CONVERT_MIN_ROWS: usize = 17;

/// Rows of 16-bit activations from which [`linear`] and [`swiglu`] decode the layer to dense
/// weights ([`expand_cuda`]) and run MLX's matmul: the fused kernel decodes every weight once per
/// pass of up to 64 rows, the dense path once per call.
pub const DENSE_MIN_ROWS: usize = 65;

/// Whether `m` rows of `dtype` activations take the dense path.
pub fn uses_dense(m: usize, dtype: Dtype) -> bool {
    m >= DENSE_MIN_ROWS && dtype != Dtype::Float32
}

const SOURCE: &str = include_str!("../../../kernels/cuda/gate_up.cu");
const FRAGMENT_HEADER: &str = include_str!("../../../kernels/cuda/fragment.cuh");

/// How one call of the axis-1 kernel is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AxisOneConfig {
    /// 8-row MMA tiles of activation rows per pass (1 to 8).
    pub mt: u32,
    /// 16-row tiles of output rows per thread block (1 to 4); every tile of a block reuses its
    /// activation fragments.
    pub rt: u32,
    /// Warps per thread block (1 to 8); they split each row's blocks and add their sums at the end.
    pub warps: u32,
    /// Carry y + 1534 in the fragments and subtract the bias at the end (16-bit activations).
    pub bias_fold: bool,
    /// Pack half of the code pairs with an IMAD instead of a PRMT (needs `bias_fold`).
    pub pack_fma: bool,
}

impl AxisOneConfig {
    /// An error naming the first reason this shape cannot run `dtype` activations.
    pub fn check(&self, dtype: Dtype) -> Result<()> {
        if !(1..=8).contains(&self.mt) || !(1..=4).contains(&self.rt) || !(1..=8).contains(&self.warps) {
            invalid!(
                "CUDA axis-1 kernel: mt = {} (1..=8), rt = {} (1..=4), warps = {} (1..=8) out of range",
                self.mt,
                self.rt,
                self.warps
            );
        }
        if self.pack_fma && !self.bias_fold {
            invalid!("CUDA axis-1 kernel: pack_fma packs the bias fold's pairs (needs bias_fold)");
        }
        if self.bias_fold && dtype == Dtype::Float32 {
            invalid!("CUDA axis-1 kernel: the bias fold is for 16-bit activations");
        }
        Ok(())
    }
}

/// Whether the kernel serves `g`: axis 1, row-major codes, T = 256, L <= 16, k in 2..=8.
pub fn supports(g: &TrellisGeometry) -> bool {
    g.axis == 1 && g.layout() == CodeLayout::RowMajor && g.t == 256 && g.l <= 16 && (2..=8).contains(&g.k)
}

/// The shape for `m` rows of `dtype` activations (`fused`: the gate·up·SwiGLU kernel, which
/// holds two accumulator sets and so takes one row tile a block).
pub fn plan(m: usize, dtype: Dtype, fused: bool) -> AxisOneConfig {
    let tiles = m.div_ceil(8).max(1);
    // Passes of up to 8 tiles (64 rows) that share the rows evenly.
    let mt = tiles.div_ceil(tiles.div_ceil(8)) as u32;
    let sixteen_bit = dtype != Dtype::Float32;
    AxisOneConfig {
        mt,
        rt: if fused || mt > 2 { 1 } else { 2 },
        warps: 4,
        bias_fold: sixteen_bit && mt <= 2,
        pack_fma: sixteen_bit && m == 1,
    }
}

/// `x2 [M, in] · W -> [M, out]` in `x2`'s dtype for an axis-1 layer.
pub fn linear(x2: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, &[(codes, scales)], g)?;
    if uses_dense(m, x2.dtype()) {
        return x2.matmul(&expand_cuda(codes, scales, g, x2.dtype())?.t()?);
    }
    linear_with(x2, codes, scales, g, plan(m, x2.dtype(), false))
}

/// [`linear`] with an explicit shape (for tuning).
pub fn linear_with(
    x2: &MlxArray,
    codes: &MlxArray,
    scales: &MlxArray,
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
) -> Result<MlxArray> {
    let m = check("CUDA axis-1 kernel", x2, &[(codes, scales)], g)?;
    let (x, read) = kernel_input(x2, m)?;
    let prepared = prepared_launch(g, cfg, m, read, x2.dtype(), false)?;
    Ok(prepared.kernel.apply_prepared(&[&x, codes, scales], &prepared.launch)?.remove(0))
}

/// `silu(x2 · Wg) ⊙ (x2 · Wu)` `[M, intermediate]` in `x2`'s dtype: the gate and up projections
/// of the same rows in one launch.
pub fn swiglu(x2: &MlxArray, gate: &TrellisLinear, up: &TrellisLinear) -> Result<MlxArray> {
    let m = x2.shape().first().copied().unwrap_or(0);
    if uses_dense(m, x2.dtype()) && supports(gate.geometry()) && up.geometry() == gate.geometry() {
        let g = linear(x2, gate.codes(), gate.scales(), gate.geometry())?;
        let u = linear(x2, up.codes(), up.scales(), up.geometry())?;
        return g.silu()?.multiply(&u);
    }
    swiglu_with(x2, gate, up, plan(m, x2.dtype(), true))
}

/// [`swiglu`] with an explicit shape (for tuning).
pub fn swiglu_with(x2: &MlxArray, gate: &TrellisLinear, up: &TrellisLinear, cfg: AxisOneConfig) -> Result<MlxArray> {
    let g = gate.geometry();
    if up.geometry() != g {
        unserved!("CUDA gate·up kernel: gate {g} and up {} differ; the fused kernel needs one geometry", up.geometry());
    }
    let m = check("CUDA gate·up kernel", x2, &[(gate.codes(), gate.scales()), (up.codes(), up.scales())], g)?;
    let (x, read) = kernel_input(x2, m)?;
    let prepared = prepared_launch(g, cfg, m, read, x2.dtype(), true)?;
    let inputs = [&x, gate.codes(), gate.scales(), up.codes(), up.scales()];
    Ok(prepared.kernel.apply_prepared(&inputs, &prepared.launch)?.remove(0))
}

/// Checks the call: a served geometry, `x2 [M >= 1, in]` in f32/f16/bf16, each layer's codes
/// and scales in `g`'s shapes. Returns `M`.
fn check(what: &str, x2: &MlxArray, layers: &[(&MlxArray, &MlxArray)], g: &TrellisGeometry) -> Result<usize> {
    if !supports(g) {
        unserved!("{what}: unsupported geometry {g} (needs axis 1, row-major codes, T 256, L <= 16, k 2..=8)");
    }
    let shape = x2.shape();
    if shape.len() != 2 || shape[0] == 0 || shape[1] != g.in_features() {
        invalid!("{what}: activations {shape:?} must be [M >= 1, {}]", g.in_features());
    }
    if !matches!(x2.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        invalid!("{what}: activations are {}, expected float32, float16 or bfloat16", x2.dtype());
    }
    for (codes, scales) in layers {
        crate::trellis::operands::check_layer(what, codes, scales, g)?;
    }
    Ok(shape[0])
}

/// The activations as the kernel reads them, and their dtype: bf16 as f16 from
/// [`CONVERT_MIN_ROWS`] rows, else as given.
fn kernel_input(x2: &MlxArray, m: usize) -> Result<(MlxArray, Dtype)> {
    if x2.dtype() == Dtype::Bfloat16 && m >= CONVERT_MIN_ROWS {
        Ok((x2.astype(Dtype::Float16)?, Dtype::Float16))
    } else {
        Ok((x2.clone(), x2.dtype()))
    }
}

/// The source of one variant (`fused` or the single projection), cut once.
fn variant_source(fused: bool) -> Result<&'static str> {
    static SOURCES: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    let cell = &SOURCES[usize::from(fused)];
    if let Some(text) = cell.get() {
        return Ok(text);
    }
    let text = source_variant(SOURCE, "TRELLIS_FUSED", fused).context("CUDA axis-1 kernel source gate_up.cu")?;
    Ok(cell.get_or_init(|| text))
}

fn kernel(fused: bool) -> Result<&'static CudaKernel> {
    let key = KernelKey { family: "gate_up", variant: if fused { "fused" } else { "single" }, shared_memory: 0 };
    registry::cuda(key, || {
        let (inputs, outputs): (&'static [&'static str], &'static [&'static str]) = if fused {
            (&["x", "codes", "scales", "up_codes", "up_scales"], &["y"])
        } else {
            (&["x", "codes", "scales"], &["y"])
        };
        Ok(KernelText {
            inputs,
            outputs,
            body: variant_source(fused)?.to_string(),
            header: format!("{CUDA_HEADER}\n{FRAGMENT_HEADER}"),
        })
    })
}

/// One call's kernel and launch, prepared once per geometry, shape, row count, dtype and variant.
struct Prepared {
    kernel: &'static CudaKernel,
    launch: CudaLaunch,
}

/// `read` is the dtype the kernel reads the activations in, `dtype` the output's.
fn prepared_launch(
    g: &TrellisGeometry,
    cfg: AxisOneConfig,
    m: usize,
    read: Dtype,
    dtype: Dtype,
    fused: bool,
) -> Result<std::sync::Arc<Prepared>> {
    type Key = (TrellisGeometry, AxisOneConfig, usize, Dtype, Dtype, bool);
    static LAUNCHES: LaunchCache<Key, Prepared> = LaunchCache::new(1024);
    LAUNCHES.get_or_build((*g, cfg, m, read, dtype, fused), || {
        cfg.check(dtype)?;
        let outputs = g.out_features();
        let rows_per_block = 16 * cfg.rt as usize;
        let passes = m.div_ceil(8 * cfg.mt as usize);
        let threads = 32 * cfg.warps as usize;
        let sixteen_bit = dtype != Dtype::Float32;
        let launch = LaunchConfig::new([threads, outputs.div_ceil(rows_per_block), passes], [threads, 1, 1])
            .output(&[m, outputs], dtype)
            .template_dtype("T", read)
            .template_dtype("Y", dtype)
            .template_int("K", g.k as i32)
            .template_int("L", g.l as i32)
            .template_int("MT", cfg.mt as i32)
            .template_int("RT", cfg.rt as i32)
            .template_int("WARPS", cfg.warps as i32)
            .template_bool("SPLIT_X", !sixteen_bit)
            .template_bool("BIAS_FOLD", cfg.bias_fold && sixteen_bit)
            .template_bool("PACK_FMA", cfg.pack_fma && cfg.bias_fold && sixteen_bit);
        let kernel = kernel(fused)?;
        Ok(Prepared { kernel, launch: kernel.prepare(&launch)? })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planned_shape_is_valid_and_passes_share_the_rows() {
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for fused in [false, true] {
                for m in 1..=300 {
                    let cfg = plan(m, dtype, fused);
                    cfg.check(dtype).unwrap_or_else(|e| panic!("M {m} {dtype}: {e}"));
                    let passes = m.div_ceil(8 * cfg.mt as usize);
                    // Every pass but the last is full, and the last holds at least one 8-row tile
                    // more than the full ones leave.
                    assert!(8 * cfg.mt as usize * (passes - 1) < m, "M {m}: {cfg:?}");
                    assert!(cfg.mt <= 8);
                }
            }
        }
        assert_eq!(plan(72, Dtype::Bfloat16, true).mt, 5);
        assert!(plan(1, Dtype::Bfloat16, false).pack_fma && !plan(1, Dtype::Float32, false).bias_fold);
    }

    #[test]
    fn each_variant_registers_only_its_own_sections() {
        // Registered compacted: comments (which name both variants) are gone.
        let compact = |fused| crate::kernel::compact::compact_plain_cpp(variant_source(fused).unwrap()).unwrap();
        let (single, fused) = (compact(false), compact(true));
        assert!(fused.contains("up_codes") && !single.contains("up_codes"));
        assert!(fused.contains("__expf") && !single.contains("__expf"));
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
}
