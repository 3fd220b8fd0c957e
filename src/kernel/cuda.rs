//! [`CudaKernel`]: a custom CUDA kernel (MLX's `mx.fast.cuda_kernel`), and [`CudaLaunch`], a
//! launch configuration converted for MLX once.

use std::ffi::c_int;

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::ffi::call_value;

use super::apply::{apply_kernel, cstring, CudaConfig, Names};
use super::include::{mlx_body, mlx_header};
use super::source::{fnv1a, KernelSource, LaunchConfig, TemplateArg};
use crate::dtype::Dtype;

/// CUDA's `__launch_bounds__(threads, min_blocks)` for a kernel: at most `threads` threads a
/// block, and registers few enough for `min_blocks` such blocks on an SM (ptxas caps each thread's
/// registers accordingly, spilling if it must). A launch of more threads fails, so the caller
/// registers a kernel under the bounds of the blocks it launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LaunchBounds {
    /// Threads a block (the launch's, exactly).
    pub threads: u32,
    /// Blocks an SM the registers must leave room for.
    pub min_blocks: u32,
}

impl LaunchBounds {
    /// The header lines that give the kernel these bounds. MLX's `cuda_kernel` writes the
    /// kernel's signature itself (`__global__ void name(...)`, after the header), so the header
    /// redefines `__global__` (CUDA's `__location__(global)`) to carry them; MLX's own headers,
    /// included before it, are not affected, and the kernel's text is the only one after it.
    pub fn header(&self) -> String {
        format!(
            "\n#undef __global__\n#define __global__ __location__(global) __launch_bounds__({}, {})\n",
            self.threads, self.min_blocks
        )
    }
}

/// A custom CUDA kernel (MLX's `mx.fast.cuda_kernel`), compiled by NVRTC at first use.
pub struct CudaKernel {
    raw: sys::mlx_fast_cuda_kernel,
    source: KernelSource,
    shared_memory: usize,
    /// The header and body as MLX got them (`#include` lines or the compacted text; see
    /// `include.rs`).
    mlx_header: String,
    mlx_body: String,
}

impl CudaKernel {
    /// Registers a kernel body with `shared_memory` bytes of dynamic shared memory per block.
    /// Fails on an MLX build without CUDA.
    pub fn new(source: KernelSource, shared_memory: usize) -> Result<CudaKernel> {
        let (header, body) = (mlx_header(&source.header), mlx_body(&source.source, &source.input_names));
        CudaKernel::with_mlx_text(source, header, body, shared_memory)
    }

    /// Registers `source` with MLX given `header` and `body` for its text: MLX copies a kernel's
    /// whole text at every application and hashes it at every evaluation, so it gets an
    /// `#include` line of a file where one can be written, the compacted text otherwise
    /// (`include.rs`).
    fn with_mlx_text(source: KernelSource, header: String, body: String, shared_memory: usize) -> Result<CudaKernel> {
        source.validate("CUDA kernel")?;
        let shared = c_int::try_from(shared_memory).map_err(|_| {
            Error::invalid(format!("CUDA kernel {:?}: {shared_memory} bytes of shared memory", source.name))
        })?;
        let (inputs, outputs) = (Names::new(&source.input_names)?, Names::new(&source.output_names)?);
        let name = cstring(&source.name, "kernel name")?;
        let (c_body, c_header) = (cstring(&body, "kernel source")?, cstring(&header, "kernel header")?);
        // SAFETY: all strings are NUL-terminated and both name vectors live for the call; mlx-c
        // copies everything into the kernel object, which is freed in `Drop`.
        let raw = call_value(|| unsafe {
            sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs.raw,
                outputs.raw,
                c_body.as_ptr(),
                c_header.as_ptr(),
                source.ensure_row_contiguous,
                shared,
            )
        })
        .with_context(|| format!("creating CUDA kernel {:?}", source.name))?;
        Ok(CudaKernel { raw, source, shared_memory, mlx_header: header, mlx_body: body })
    }

    /// The description the kernel was built from.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// Applies the kernel to `inputs` on the current stream; returns the (lazy) outputs.
    pub fn apply(&self, inputs: &[&MlxArray], cfg: &LaunchConfig) -> Result<Vec<MlxArray>> {
        cfg.validate(&self.source, inputs.len(), "CUDA")?;
        self.apply_config(inputs, &CudaConfig::build(cfg)?)
    }

    /// Checks `cfg` against this kernel and converts it for MLX once, for a configuration
    /// applied many times ([`CudaKernel::apply_prepared`]). The template arguments are written
    /// into the source of a kernel object of the launch's own (`constexpr` constants and type
    /// aliases after the header, as MLX writes them inside the kernel), which the launch holds:
    /// MLX formats every template argument twice at every call of a kernel that takes them, the
    /// largest part of a call's host time (see docs/cuda-down.md, "Registration and launch").
    pub fn prepare(&self, cfg: &LaunchConfig) -> Result<CudaLaunch> {
        // No inputs yet: `apply_prepared` checks their count at each call.
        cfg.validate(&self.source, self.source.input_names.len(), "CUDA")?;
        let baked = if cfg.template_args.is_empty() {
            None
        } else {
            let constants = constants(&cfg.template_args);
            let mut source = self.source.clone();
            // The name carries the constants: MLX keys its compiled kernels by name.
            source.name = format!("{}_{:016x}", source.name, fnv1a(&[&constants]));
            source.header = format!("{}\n{constants}", source.header);
            // The same header and body files as this kernel's, the constants after them.
            let header = format!("{}\n{constants}", self.mlx_header);
            Some(CudaKernel::with_mlx_text(source, header, self.mlx_body.clone(), self.shared_memory)?)
        };
        let plain = LaunchConfig { template_args: Vec::new(), ..cfg.clone() };
        Ok(CudaLaunch {
            config: CudaConfig::build(&plain)?,
            input_names: self.source.input_names.clone(),
            output_names: self.source.output_names.clone(),
            baked,
        })
    }

    /// [`CudaKernel::apply`] with a configuration prepared for a kernel with this kernel's
    /// argument names.
    pub fn apply_prepared(&self, inputs: &[&MlxArray], launch: &CudaLaunch) -> Result<Vec<MlxArray>> {
        let name = &self.source.name;
        if launch.input_names != self.source.input_names || launch.output_names != self.source.output_names {
            invalid!(
                "CUDA kernel {name:?}: launch prepared for arguments {:?} -> {:?}, the kernel takes {:?} -> {:?}",
                launch.input_names,
                launch.output_names,
                self.source.input_names,
                self.source.output_names
            );
        }
        self.source.check_input_count(inputs.len(), "CUDA")?;
        launch.baked.as_ref().unwrap_or(self).apply_config(inputs, &launch.config)
    }

    fn apply_config(&self, inputs: &[&MlxArray], config: &CudaConfig) -> Result<Vec<MlxArray>> {
        apply_kernel("CUDA", &self.source.name, inputs, |outs, ins, stream| {
            // SAFETY: all handles are live for the call; `outs` is a live vector to fill.
            unsafe { sys::mlx_fast_cuda_kernel_apply(outs, self.raw, ins, config.raw, stream) }
        })
    }
}

/// A [`LaunchConfig`] checked and converted for MLX once ([`CudaKernel::prepare`]); it serves
/// any kernel with the same argument names.
pub struct CudaLaunch {
    config: CudaConfig,
    input_names: Vec<String>,
    output_names: Vec<String>,
    /// The kernel with the launch's template arguments in its source (none without any).
    baked: Option<CudaKernel>,
}

/// Template arguments as CUDA source at namespace scope, as MLX writes them inside a kernel:
/// `constexpr int N = 1;`, `constexpr bool B = true;`, `using T = __nv_bfloat16;`.
fn constants(args: &[(String, TemplateArg)]) -> String {
    args.iter()
        .map(|(name, arg)| match arg {
            TemplateArg::Int(i) => format!("constexpr int {name} = {i};\n"),
            TemplateArg::Bool(b) => format!("constexpr bool {name} = {b};\n"),
            TemplateArg::Dtype(d) => format!("using {name} = {};\n", cuda_type(*d)),
        })
        .collect()
}

/// The CUDA type of a dtype, as MLX's `dtype_to_cuda_type` names it.
fn cuda_type(d: Dtype) -> &'static str {
    match d {
        Dtype::Bool => "bool",
        Dtype::Uint8 => "uint8_t",
        Dtype::Uint16 => "uint16_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Uint64 => "uint64_t",
        Dtype::Int8 => "int8_t",
        Dtype::Int16 => "int16_t",
        Dtype::Int32 => "int32_t",
        Dtype::Int64 => "int64_t",
        Dtype::Float16 => "__half",
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float32 => "float",
        Dtype::Float64 => "double",
        Dtype::Complex64 => "mlx::core::cu::complex64_t",
    }
}

impl std::fmt::Debug for CudaLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLaunch")
            .field("input_names", &self.input_names)
            .field("output_names", &self.output_names)
            .finish_non_exhaustive()
    }
}

// SAFETY: the mlx-c configuration is never changed after `prepare`: `mlx_fast_cuda_kernel_apply`
// copies what it reads from it, so it may be shared across threads and freed on any of them.
unsafe impl Send for CudaLaunch {}
// SAFETY: as above; only `apply_prepared` reads it, through `&self`.
unsafe impl Sync for CudaLaunch {}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: the kernel is owned by this value and freed exactly once.
        unsafe { sys::mlx_fast_cuda_kernel_free(self.raw) };
    }
}

// SAFETY: as for `MetalKernel`: an immutable description once created; compilation and caching
// happen inside MLX under its own locks.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants are written as MLX writes template arguments inside a kernel, in order.
    #[test]
    fn template_arguments_become_the_source_mlx_would_write() {
        let args = vec![
            ("T".to_string(), TemplateArg::Dtype(Dtype::Bfloat16)),
            ("R".to_string(), TemplateArg::Int(-576)),
            ("FOLD".to_string(), TemplateArg::Bool(true)),
            ("Y".to_string(), TemplateArg::Dtype(Dtype::Float32)),
        ];
        assert_eq!(
            constants(&args),
            "using T = __nv_bfloat16;\nconstexpr int R = -576;\nconstexpr bool FOLD = true;\nusing Y = float;\n"
        );
        assert_eq!((cuda_type(Dtype::Float16), cuda_type(Dtype::Uint32)), ("__half", "uint32_t"));
        // Different constants, different kernel names.
        assert_ne!(fnv1a(&[&constants(&args[..1])]), fnv1a(&[&constants(&args[..2])]));
    }

    /// The bounds reach the kernel through a `__global__` that carries them, on lines of their
    /// own (the header may end without a newline).
    #[test]
    fn launch_bounds_redefine_global_for_the_kernel_after_them() {
        let header = LaunchBounds { threads: 128, min_blocks: 5 }.header();
        assert_eq!(header, "\n#undef __global__\n#define __global__ __location__(global) __launch_bounds__(128, 5)\n");
    }
}
