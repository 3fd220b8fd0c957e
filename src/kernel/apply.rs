//! What both kernel wrappers hand to mlx-c: owned name vectors, the kernel configuration built
//! from a [`LaunchConfig`] (one macro, since mlx-c's Metal and CUDA configs have the same
//! operations), and the application of a kernel on the current stream.

use std::ffi::{c_char, c_int, CString};

use mlx_sys as sys;

use crate::array::{dims, MlxArray};
use crate::device::with_current;
use crate::error::{Error, ErrorContext, Result};
use crate::ffi::{call, call_value};
use crate::ops::VectorArray;

use super::source::{LaunchConfig, TemplateArg};

/// An owned `mlx_vector_string` built from names.
pub(crate) struct Names {
    pub(crate) raw: sys::mlx_vector_string,
}

impl Names {
    pub(crate) fn new(names: &[String]) -> Result<Names> {
        let owned: Vec<CString> = names
            .iter()
            .map(|n| CString::new(n.as_str()).map_err(|_| Error::invalid(format!("name {n:?} contains a NUL byte"))))
            .collect::<std::result::Result<_, _>>()?;
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated strings that outlive the call; mlx-c
        // copies them into its own vector.
        let raw = call_value(|| unsafe { sys::mlx_vector_string_new_data(ptrs.as_mut_ptr(), ptrs.len()) })?;
        Ok(Names { raw })
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        // SAFETY: the vector is owned by this value and freed exactly once.
        unsafe { sys::mlx_vector_string_free(self.raw) };
    }
}

pub(crate) fn cstring(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

/// The operations a kernel config offers, identical in shape for Metal and CUDA.
macro_rules! kernel_config {
    ($config:ident, $raw:ident, $new:ident, $free:ident, $add_output:ident, $grid:ident, $group:ident, $init:ident,
     $verbose:ident, $t_dtype:ident, $t_int:ident, $t_bool:ident) => {
        /// An owned mlx-c kernel configuration, filled from a [`LaunchConfig`].
        pub(crate) struct $config {
            pub(crate) raw: sys::$raw,
        }

        impl $config {
            pub(crate) fn build(cfg: &LaunchConfig) -> Result<$config> {
                // SAFETY: creating an empty config has no preconditions; freed in `Drop`.
                let config = $config { raw: unsafe { sys::$new() } };
                for out in &cfg.outputs {
                    let shape = dims(&out.shape)?;
                    // SAFETY: `shape` is live for the call; the config copies it.
                    call(|| unsafe { sys::$add_output(config.raw, shape.as_ptr(), shape.len(), out.dtype.to_raw()) })?;
                }
                let [gx, gy, gz] = cfg.grid.map(|d| d as c_int);
                // SAFETY: scalar arguments on a live config.
                call(|| unsafe { sys::$grid(config.raw, gx, gy, gz) })?;
                let [tx, ty, tz] = cfg.thread_group.map(|d| d as c_int);
                // SAFETY: scalar arguments on a live config.
                call(|| unsafe { sys::$group(config.raw, tx, ty, tz) })?;
                if let Some(v) = cfg.init_value {
                    // SAFETY: scalar argument on a live config.
                    call(|| unsafe { sys::$init(config.raw, v) })?;
                }
                // SAFETY: scalar argument on a live config.
                call(|| unsafe { sys::$verbose(config.raw, cfg.verbose) })?;
                for (name, value) in &cfg.template_args {
                    let cname = cstring(name, "template argument name")?;
                    // `cname` is NUL-terminated and outlives each call; the config copies it.
                    let (raw, name) = (config.raw, cname.as_ptr());
                    match *value {
                        TemplateArg::Dtype(d) => {
                            // SAFETY: a live config and a NUL-terminated name (above).
                            call(|| unsafe { sys::$t_dtype(raw, name, d.to_raw()) })?
                        }
                        TemplateArg::Int(i) => {
                            // SAFETY: as above.
                            call(|| unsafe { sys::$t_int(raw, name, i) })?
                        }
                        TemplateArg::Bool(b) => {
                            // SAFETY: as above.
                            call(|| unsafe { sys::$t_bool(raw, name, b) })?
                        }
                    }
                }
                Ok(config)
            }
        }

        impl Drop for $config {
            fn drop(&mut self) {
                // SAFETY: the config is owned by this value and freed exactly once.
                unsafe { sys::$free(self.raw) };
            }
        }
    };
}

kernel_config!(
    MetalConfig,
    mlx_fast_metal_kernel_config,
    mlx_fast_metal_kernel_config_new,
    mlx_fast_metal_kernel_config_free,
    mlx_fast_metal_kernel_config_add_output_arg,
    mlx_fast_metal_kernel_config_set_grid,
    mlx_fast_metal_kernel_config_set_thread_group,
    mlx_fast_metal_kernel_config_set_init_value,
    mlx_fast_metal_kernel_config_set_verbose,
    mlx_fast_metal_kernel_config_add_template_arg_dtype,
    mlx_fast_metal_kernel_config_add_template_arg_int,
    mlx_fast_metal_kernel_config_add_template_arg_bool
);

kernel_config!(
    CudaConfig,
    mlx_fast_cuda_kernel_config,
    mlx_fast_cuda_kernel_config_new,
    mlx_fast_cuda_kernel_config_free,
    mlx_fast_cuda_kernel_config_add_output_arg,
    mlx_fast_cuda_kernel_config_set_grid,
    mlx_fast_cuda_kernel_config_set_thread_group,
    mlx_fast_cuda_kernel_config_set_init_value,
    mlx_fast_cuda_kernel_config_set_verbose,
    mlx_fast_cuda_kernel_config_add_template_arg_dtype,
    mlx_fast_cuda_kernel_config_add_template_arg_int,
    mlx_fast_cuda_kernel_config_add_template_arg_bool
);

/// Runs one kernel application `f(outputs, inputs, stream)` on the current stream and returns
/// its outputs, naming the kernel in any error.
pub(crate) fn apply_kernel(
    backend: &str,
    name: &str,
    inputs: &[&MlxArray],
    f: impl FnOnce(*mut sys::mlx_vector_array, sys::mlx_vector_array, sys::mlx_stream) -> c_int,
) -> Result<Vec<MlxArray>> {
    let ins = VectorArray::from_arrays(inputs)?;
    let mut outs = VectorArray::new();
    with_current(|s| {
        call(|| f(&mut outs.raw, ins.raw, s.raw()))?;
        Ok(())
    })
    .with_context(|| format!("applying {backend} kernel {name:?}"))?;
    outs.into_arrays()
}
