//! [`MetalKernel`]: a custom Metal kernel (MLX's `mx.fast.metal_kernel`).

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::error::{ErrorContext, Result};
use crate::ffi::call_value;

use super::apply::{apply_kernel, cstring, MetalConfig, Names};
use super::source::{KernelSource, LaunchConfig};

/// A custom Metal kernel (MLX's `mx.fast.metal_kernel`).
pub struct MetalKernel {
    raw: sys::mlx_fast_metal_kernel,
    source: KernelSource,
    atomic_outputs: bool,
}

impl MetalKernel {
    /// Registers a kernel body. `atomic_outputs` makes outputs `device atomic<T>*`.
    pub fn new(source: KernelSource, atomic_outputs: bool) -> Result<MetalKernel> {
        source.validate("Metal kernel")?;
        let (inputs, outputs) = (Names::new(&source.input_names)?, Names::new(&source.output_names)?);
        let name = cstring(&source.name, "kernel name")?;
        let body = cstring(&source.source, "kernel source")?;
        let header = cstring(&source.header, "kernel header")?;
        // SAFETY: all strings are NUL-terminated and both name vectors live for the call; mlx-c
        // copies everything into the kernel object, which is freed in `Drop`.
        let raw = call_value(|| unsafe {
            sys::mlx_fast_metal_kernel_new(
                name.as_ptr(),
                inputs.raw,
                outputs.raw,
                body.as_ptr(),
                header.as_ptr(),
                source.ensure_row_contiguous,
                atomic_outputs,
            )
        })
        .with_context(|| format!("creating Metal kernel {:?}", source.name))?;
        Ok(MetalKernel { raw, source, atomic_outputs })
    }

    /// The description the kernel was built from.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// Whether outputs are atomic.
    pub fn atomic_outputs(&self) -> bool {
        self.atomic_outputs
    }

    /// Applies the kernel to `inputs` on the current stream; returns the (lazy) outputs.
    /// Fails without Metal (unless a `MetalSimScope` is active, with the `metal-sim` feature).
    pub fn apply(&self, inputs: &[&MlxArray], cfg: &LaunchConfig) -> Result<Vec<MlxArray>> {
        cfg.validate(&self.source, inputs.len(), "Metal")?;
        #[cfg(feature = "metal-sim")]
        if crate::sim::active() {
            return crate::sim::apply(self, inputs, cfg);
        }
        let config = MetalConfig::build(cfg)?;
        apply_kernel("Metal", &self.source.name, inputs, |outs, ins, stream| {
            // SAFETY: all handles are live for the call; `outs` is a live vector to fill.
            unsafe { sys::mlx_fast_metal_kernel_apply(outs, self.raw, ins, config.raw, stream) }
        })
    }
}

impl Drop for MetalKernel {
    fn drop(&mut self) {
        // SAFETY: the kernel is owned by this value and freed exactly once.
        unsafe { sys::mlx_fast_metal_kernel_free(self.raw) };
    }
}

// SAFETY: a kernel object is an immutable description (name, sources, flags) once created; MLX
// compiles and caches per device at apply time under its own locks, and `apply` runs on the
// caller's thread and stream.
unsafe impl Send for MetalKernel {}
// SAFETY: as above; `apply` takes `&self` and does not mutate the kernel object.
unsafe impl Sync for MetalKernel {}
