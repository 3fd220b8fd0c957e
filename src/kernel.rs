//! Custom GPU kernels: thin safe wrappers over mlx-c's `mlx_fast_metal_kernel_*` and
//! `mlx_fast_cuda_kernel_*`.
//!
//! As in MLX, a kernel is only a *body*: MLX generates the signature from the input and output
//! names, the arrays' types and the template arguments (see MLX's `metal_kernel` and
//! `cuda_kernel`). A kernel object is built once ([`MetalKernel::new`], [`CudaKernel::new`]) and
//! applied many times with a [`LaunchConfig`]; each application returns lazy output arrays. A CUDA
//! launch applied many times can be checked and converted once ([`CudaKernel::prepare`]).
//!
//! Custom kernels never run on MLX's CPU back-end. A Metal kernel can be *created* anywhere and
//! fails at apply without Metal; a CUDA kernel fails at creation on a build without CUDA. With the
//! `metal-sim` feature, [`MetalKernel`] can also run on a CPU simulator of MLX's Metal wrapping
//! (see `MetalSimScope`), for testing the exact kernel text on machines without a Mac.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, CString};

use anyhow::Context;
use mlx_sys as sys;

use crate::array::{dims, MlxArray};
use crate::device::with_current;
use crate::dtype::Dtype;
use crate::error::{call, call_value, invalid, Error, Result};
use crate::ops::VectorArray;

/// What a kernel is: its name, argument names and source text (the arguments of MLX's
/// `metal_kernel` / `cuda_kernel`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// Kernel name; MLX caches compiled kernels by it (plus a hash of the source), so give each
    /// distinct source its own name.
    pub name: String,
    /// Names of the input arrays, in the order they are passed to `apply`.
    pub input_names: Vec<String>,
    /// Names of the output arrays, in the order `apply` returns them.
    pub output_names: Vec<String>,
    /// The kernel body.
    pub source: String,
    /// Text placed before the generated kernel (helper functions, constants).
    pub header: String,
    /// Copy inputs to row-contiguous layout before the kernel sees them.
    pub ensure_row_contiguous: bool,
}

impl KernelSource {
    /// A kernel description with row-contiguous inputs and no header.
    pub fn new(name: &str, input_names: &[&str], output_names: &[&str], source: &str) -> KernelSource {
        KernelSource {
            name: name.to_string(),
            input_names: input_names.iter().map(|s| s.to_string()).collect(),
            output_names: output_names.iter().map(|s| s.to_string()).collect(),
            source: source.to_string(),
            header: String::new(),
            ensure_row_contiguous: true,
        }
    }

    /// The same description with `header` before the kernel.
    pub fn with_header(mut self, header: &str) -> KernelSource {
        self.header = header.to_string();
        self
    }

    fn validate(&self, what: &str) -> Result<()> {
        if self.name.is_empty() {
            invalid!("{what}: the kernel needs a name");
        }
        if self.output_names.is_empty() {
            invalid!("{what} {:?}: a kernel needs at least one output", self.name);
        }
        let mut seen = HashSet::new();
        for n in self.input_names.iter().chain(&self.output_names) {
            if !is_identifier(n) {
                invalid!("{what} {:?}: argument name {n:?} is not an identifier", self.name);
            }
            if !seen.insert(n.as_str()) {
                invalid!("{what} {:?}: argument name {n:?} is used twice", self.name);
            }
        }
        if self.source.trim().is_empty() {
            invalid!("{what} {:?}: the kernel body is empty", self.name);
        }
        Ok(())
    }

    /// Checks that `inputs` arrays are given for the kernel's input names.
    fn check_input_count(&self, inputs: usize, backend: &str) -> Result<()> {
        if inputs != self.input_names.len() {
            invalid!(
                "{backend} kernel {:?}: {inputs} inputs given for {} input names {:?}",
                self.name,
                self.input_names.len(),
                self.input_names
            );
        }
        Ok(())
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// One output of a launch: its shape and element type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: Dtype,
}

/// A template argument's value: a type, an int or a bool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateArg {
    /// `typename NAME` (Metal) / `using NAME = ...` (CUDA).
    Dtype(Dtype),
    /// `int NAME`.
    Int(i32),
    /// `bool NAME`.
    Bool(bool),
}

/// How one application of a kernel runs (the arguments of MLX's kernel call).
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// The outputs to allocate, in the order of the kernel's output names.
    pub outputs: Vec<OutputSpec>,
    /// Total **threads** along x, y, z (not threadgroups / blocks).
    pub grid: [usize; 3],
    /// Threads per threadgroup (Metal) or block (CUDA).
    pub thread_group: [usize; 3],
    /// Template arguments in order: type names (`T`), ints and bools.
    pub template_args: Vec<(String, TemplateArg)>,
    /// Value every output element is set to before the kernel runs (outputs are uninitialised
    /// otherwise).
    pub init_value: Option<f32>,
    /// Print the generated source when MLX compiles it.
    pub verbose: bool,
}

impl LaunchConfig {
    /// A launch of `grid` threads in groups of `thread_group`, with no outputs or template
    /// arguments yet.
    pub fn new(grid: [usize; 3], thread_group: [usize; 3]) -> LaunchConfig {
        LaunchConfig {
            outputs: Vec::new(),
            grid,
            thread_group,
            template_args: Vec::new(),
            init_value: None,
            verbose: false,
        }
    }

    /// Adds an output.
    pub fn output(mut self, shape: &[usize], dtype: Dtype) -> LaunchConfig {
        self.outputs.push(OutputSpec { shape: shape.to_vec(), dtype });
        self
    }

    /// Adds a type template argument.
    pub fn template_dtype(mut self, name: &str, dtype: Dtype) -> LaunchConfig {
        self.template_args.push((name.to_string(), TemplateArg::Dtype(dtype)));
        self
    }

    /// Adds an int template argument.
    pub fn template_int(mut self, name: &str, value: i32) -> LaunchConfig {
        self.template_args.push((name.to_string(), TemplateArg::Int(value)));
        self
    }

    /// Adds a bool template argument.
    pub fn template_bool(mut self, name: &str, value: bool) -> LaunchConfig {
        self.template_args.push((name.to_string(), TemplateArg::Bool(value)));
        self
    }

    /// Sets every output element to `value` before the kernel runs.
    pub fn init_value(mut self, value: f32) -> LaunchConfig {
        self.init_value = Some(value);
        self
    }

    /// Checks the configuration against the kernel it is applied to.
    fn validate(&self, source: &KernelSource, inputs: usize, backend: &str) -> Result<()> {
        let name = &source.name;
        source.check_input_count(inputs, backend)?;
        if self.outputs.len() != source.output_names.len() {
            invalid!(
                "{backend} kernel {name:?}: {} outputs configured for {} output names {:?}",
                self.outputs.len(),
                source.output_names.len(),
                source.output_names
            );
        }
        if self.grid.iter().chain(&self.thread_group).any(|&d| d == 0 || d > c_int::MAX as usize) {
            invalid!(
                "{backend} kernel {name:?}: grid {:?} and thread group {:?} need every entry in 1..=2^31-1",
                self.grid,
                self.thread_group
            );
        }
        let mut seen = HashSet::new();
        for (arg, value) in &self.template_args {
            if !is_identifier(arg) {
                invalid!("{backend} kernel {name:?}: template argument name {arg:?} is not an identifier");
            }
            if !seen.insert(arg.as_str()) {
                invalid!("{backend} kernel {name:?}: template argument {arg:?} is given twice");
            }
            if source.input_names.iter().chain(&source.output_names).any(|n| n == arg) {
                invalid!("{backend} kernel {name:?}: template argument {arg:?} has the name of a kernel argument");
            }
            match *value {
                TemplateArg::Int(v) if v < 0 => invalid!(
                    "{backend} kernel {name:?}: template int {arg} = {v} is negative; MLX spells template values into the kernel's name, which must stay an identifier"
                ),
                TemplateArg::Dtype(d) if matches!(d, Dtype::Float64 | Dtype::Complex64) => {
                    invalid!("{backend} kernel {name:?}: template type {arg} = {d} is not a GPU kernel type")
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// An owned `mlx_vector_string` built from names.
struct Names {
    raw: sys::mlx_vector_string,
}

impl Names {
    fn new(names: &[String]) -> Result<Names> {
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

fn cstring(text: &str, what: &str) -> Result<CString> {
    Ok(CString::new(text).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))?)
}

/// The operations a kernel config offers, identical in shape for Metal and CUDA.
macro_rules! kernel_config {
    ($config:ident, $raw:ident, $new:ident, $free:ident, $add_output:ident, $grid:ident, $group:ident, $init:ident,
     $verbose:ident, $t_dtype:ident, $t_int:ident, $t_bool:ident) => {
        /// An owned mlx-c kernel configuration, filled from a [`LaunchConfig`].
        struct $config {
            raw: sys::$raw,
        }

        impl $config {
            fn build(cfg: &LaunchConfig) -> Result<$config> {
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
                    match *value {
                        // SAFETY: `cname` is NUL-terminated and outlives the call; the config copies it.
                        TemplateArg::Dtype(d) => {
                            call(|| unsafe { sys::$t_dtype(config.raw, cname.as_ptr(), d.to_raw()) })?
                        }
                        // SAFETY: as above.
                        TemplateArg::Int(i) => call(|| unsafe { sys::$t_int(config.raw, cname.as_ptr(), i) })?,
                        // SAFETY: as above.
                        TemplateArg::Bool(b) => call(|| unsafe { sys::$t_bool(config.raw, cname.as_ptr(), b) })?,
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

/// A custom CUDA kernel (MLX's `mx.fast.cuda_kernel`), compiled by NVRTC at first use.
pub struct CudaKernel {
    raw: sys::mlx_fast_cuda_kernel,
    source: KernelSource,
}

impl CudaKernel {
    /// Registers a kernel body with `shared_memory` bytes of dynamic shared memory per block.
    /// Fails on an MLX build without CUDA.
    pub fn new(source: KernelSource, shared_memory: usize) -> Result<CudaKernel> {
        source.validate("CUDA kernel")?;
        let shared = c_int::try_from(shared_memory).map_err(|_| {
            Error::invalid(format!("CUDA kernel {:?}: {shared_memory} bytes of shared memory", source.name))
        })?;
        let (inputs, outputs) = (Names::new(&source.input_names)?, Names::new(&source.output_names)?);
        let name = cstring(&source.name, "kernel name")?;
        // MLX's CUDA back-end hashes the whole generated source on every evaluation of the
        // kernel (its module cache key) and copies it on every application, so comments and
        // indentation cost host time on each call: about 0.2 µs per KB on the host of an H200
        // machine. `MLX_TRELLIS_KEEP_CUDA_SOURCE=1` keeps them (compile errors then name the
        // kernel files' own lines).
        let body = cstring(&compact_cuda_source(&source.source), "kernel source")?;
        let header = cstring(&compact_cuda_source(&source.header), "kernel header")?;
        // SAFETY: all strings are NUL-terminated and both name vectors live for the call; mlx-c
        // copies everything into the kernel object, which is freed in `Drop`.
        let raw = call_value(|| unsafe {
            sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs.raw,
                outputs.raw,
                body.as_ptr(),
                header.as_ptr(),
                source.ensure_row_contiguous,
                shared,
            )
        })
        .with_context(|| format!("creating CUDA kernel {:?}", source.name))?;
        Ok(CudaKernel { raw, source })
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
    /// applied many times ([`CudaKernel::apply_prepared`]); converting it at every call costs a
    /// few µs of host time with many template arguments.
    pub fn prepare(&self, cfg: &LaunchConfig) -> Result<CudaLaunch> {
        // No inputs yet: `apply_prepared` checks their count at each call.
        cfg.validate(&self.source, self.source.input_names.len(), "CUDA")?;
        Ok(CudaLaunch {
            config: CudaConfig::build(cfg)?,
            input_names: self.source.input_names.clone(),
            output_names: self.source.output_names.clone(),
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
        self.apply_config(inputs, &launch.config)
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

/// Runs one kernel application `f(outputs, inputs, stream)` on the current stream and returns
/// its outputs, naming the kernel in any error.
fn apply_kernel(
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

/// CUDA C++ text without comments, indentation or blank lines, for the same tokens and
/// directives. Only text in a plain subset of C++ is compacted; anything else is returned as
/// written: line continuations (a backslash at the end of a line, which NVRTC and GCC read
/// differently when spaces follow it), carriage returns, raw string literals, `__LINE__` (whose
/// values would change), comments or literals left open, and `#include` lines with a comment
/// marker. A block comment becomes one space (the standard's translation phase 3, before
/// directives are read), a `'` after a number or an identifier other than a character-literal
/// prefix is a digit separator, and only ASCII blanks are trimmed.
fn compact_cuda_source(text: &str) -> String {
    if std::env::var_os(KEEP_CUDA_SOURCE).is_some_and(|v| v == "1") {
        return text.to_string();
    }
    compact_plain_cpp(text).unwrap_or_else(|| text.to_string())
}

/// The environment variable that, set to `1`, registers CUDA sources as written (kernel compile
/// errors then name the lines of the files under `kernels/`).
const KEEP_CUDA_SOURCE: &str = "MLX_TRELLIS_KEEP_CUDA_SOURCE";

/// [`compact_cuda_source`]'s work: `None` where the text leaves the plain subset.
pub(crate) fn compact_plain_cpp(text: &str) -> Option<String> {
    let ends_with_backslash = |line: &str| line.trim_end_matches([' ', '\t', '\x0b', '\x0c']).ends_with('\\');
    if text.contains('\r') || text.contains("R\"") || text.contains("__LINE__") || text.lines().any(ends_with_backslash)
    {
        return None;
    }
    let bytes = text.as_bytes();
    let mut code = Vec::with_capacity(bytes.len());
    let mut line_start = true; // only blanks since the last newline
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if line_start && b == b'#' {
            let line_end = text[i..].find('\n').map_or(bytes.len(), |e| i + e);
            let directive = &text[i + 1..line_end];
            if directive.trim_start_matches([' ', '\t']).starts_with("include") {
                // `<a//b.h>` is a header name, not a comment: keep the line as written.
                if directive.contains("/*") || directive.contains("//") {
                    return None;
                }
                code.extend_from_slice(&bytes[i..line_end]);
                i = line_end;
                continue;
            }
        }
        // Comments and blanks leave `line_start` as it was: a directive may follow them.
        match b {
            b'\n' => {
                line_start = true;
                code.push(b);
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(bytes.len(), |e| i + e);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2 + text[i + 2..].find("*/")? + 2;
                code.push(b' ');
            }
            b' ' | b'\t' | b'\x0b' | b'\x0c' => {
                code.push(b);
                i += 1;
            }
            b'"' => {
                line_start = false;
                i = copy_literal(bytes, i, b'"', &mut code)?;
            }
            b'\'' if !is_digit_separator(&bytes[..i]) => {
                line_start = false;
                i = copy_literal(bytes, i, b'\'', &mut code)?;
            }
            _ => {
                line_start = false;
                code.push(b);
                i += 1;
            }
        }
    }
    // Only ASCII bytes were removed or added, at ASCII positions, so the text is still UTF-8.
    let code = String::from_utf8(code).ok()?;
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let line = line.trim_matches([' ', '\t', '\x0b', '\x0c']);
        if line.ends_with('\\') {
            // A backslash that only blanks or a comment followed: NVRTC and GCC disagree there.
            return None;
        }
        if !line.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    Some(out)
}

/// Copies the string or character literal that opens at `bytes[start]` into `out`; returns the
/// index after it, or `None` if the line ends first.
fn copy_literal(bytes: &[u8], start: usize, quote: u8, out: &mut Vec<u8>) -> Option<usize> {
    let mut i = start + 1;
    while *bytes.get(i)? != quote {
        if bytes[i] == b'\n' {
            return None;
        }
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    out.extend_from_slice(&bytes[start..=i]);
    Some(i + 1)
}

/// Whether a `'` after `before` separates digits (`1'000`, `0x1'ff`: the letters and digits
/// before it start with a digit) rather than opening a character literal (`'a'`, `u8'a'`).
fn is_digit_separator(before: &[u8]) -> bool {
    let word_len = before.iter().rev().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_').count();
    before.get(before.len() - word_len).is_some_and(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacted_cuda_source_keeps_tokens_literals_and_directives() {
        let text = "#pragma once // the header\n\
                    /* a block\n   comment */ int x = 1; // one\n\
                    \n\
                    \t  const char* s = \"// not a comment /* nor this */\"; char c = '\\''; char d = u8'/';\n\
                    #define A 1 /* a comment over\n   two lines */ + 2\n\
                    /* before a directive */ #define B 3\n\
                    int n = 1'000'000, h = 0x1'ff; const char* t = \"'//'\"; // digit separators\n\
                    float/**/z;\u{a0}\n";
        let want = "#pragma once\n\
                    int x = 1;\n\
                    const char* s = \"// not a comment /* nor this */\"; char c = '\\''; char d = u8'/';\n\
                    #define A 1   + 2\n\
                    #define B 3\n\
                    int n = 1'000'000, h = 0x1'ff; const char* t = \"'//'\";\n\
                    float z;\u{a0}\n";
        assert_eq!(compact_plain_cpp(text).as_deref(), Some(want));
        // Compacting twice changes nothing.
        assert_eq!(compact_plain_cpp(want).as_deref(), Some(want));
    }

    #[test]
    fn text_outside_the_plain_subset_is_kept_as_written() {
        for text in [
            "#define TWO(a) \\\n    ((a) + (a))\n",                   // a line continuation
            "int y; // a comment that goes on \\\nhere\n",            // a continued comment
            "#define X 1 \\ // NVRTC: no splice; GCC: one\nint y;\n", // backslash, then blanks
            "int y; // c\r\nint z;\r\n",                              // carriage returns
            "auto s = R\"(// kept)\"; // kept too\n",                 // a raw string literal
            "int line = __LINE__; // which would change\n",
            "#include <a//b.h>\n", // a header name, not a comment
            "int x; /* never closed\n",
            "const char* s = \"never closed\n;\n",
            "#error don't\n", // a lone quote
        ] {
            assert_eq!(compact_plain_cpp(text), None, "{text:?}");
            assert_eq!(compact_cuda_source(text), text, "{text:?}");
        }
    }

    /// The shipped kernels are in the plain subset, and their compacted text has the same tokens
    /// for the system's C++ preprocessor (`c++ -fpreprocessed -E`, which removes comments and
    /// nothing else) where there is one.
    #[test]
    fn compacted_kernel_sources_keep_their_tokens_and_halve() {
        let cxx = std::env::var("MSL_SIM_CXX").unwrap_or_else(|_| "c++".to_string());
        let tokens = |text: &str| -> Option<Vec<String>> {
            use std::io::Write as _;
            let mut child = std::process::Command::new(&cxx)
                .args(["-fpreprocessed", "-E", "-P", "-dD", "-x", "c++", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?;
            child.stdin.take()?.write_all(text.as_bytes()).ok()?;
            let out = child.wait_with_output().ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            Some(text.split_whitespace().map(str::to_string).collect())
        };
        for (name, text) in [
            ("down_mma.cu", include_str!("../kernels/cuda/down_mma.cu")),
            ("down_mma.cuh", include_str!("../kernels/cuda/down_mma.cuh")),
            ("codebook.cuh", include_str!("../kernels/cuda/codebook.cuh")),
            ("expand.cu", include_str!("../kernels/cuda/expand.cu")),
            ("viterbi.cu", include_str!("../kernels/cuda/viterbi.cu")),
        ] {
            let compact = compact_plain_cpp(text).unwrap_or_else(|| panic!("{name} left the plain subset"));
            let directives = |t: &str| t.lines().map(str::trim).filter(|l| l.starts_with('#')).count();
            assert_eq!(directives(&compact), directives(text), "{name}");
            assert!(!compact.contains("//") && !compact.contains("/*"), "{name}");
            assert!(compact.len() < text.len() * 7 / 10, "{name}: {} of {} bytes", compact.len(), text.len());
            assert_eq!(compact_plain_cpp(&compact).as_deref(), Some(compact.as_str()), "{name}");
            match (tokens(text), tokens(&compact)) {
                (Some(a), Some(b)) if !a.is_empty() => assert_eq!(a, b, "{name}: tokens differ"),
                _ => println!("skipped for {name}: no C++ preprocessor at {cxx:?} (set MSL_SIM_CXX)"),
            }
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("x_2"));
        assert!(is_identifier("_T"));
        assert!(!is_identifier("2x"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
    }
}
