//! `msl-sim` runs the body of an MLX custom Metal kernel
//! (`mx.fast.metal_kernel`) on the CPU, so the exact Metal Shading Language
//! text of a GPU kernel can be tested on machines without Metal.
//!
//! Given the same arguments as MLX (name, input/output names, body, header,
//! template arguments, grid, threadgroup), [`run`]:
//!
//! 1. wraps the body into a kernel function exactly as MLX does (parameters
//!    for inputs, for `name_shape`/`name_strides`/`name_ndim` when the body
//!    mentions them, for outputs, and for every Metal thread attribute whose
//!    name appears in the body; template parameters in the given order);
//! 2. compiles it as C++17 together with a prelude implementing the supported
//!    MSL subset (scalar and vector types, `half`/`bfloat` with per-operation
//!    rounding, math, SIMD-group functions, 8x8 `simdgroup_matrix`,
//!    threadgroup memory and barriers, atomics), caching the executable;
//! 3. runs the grid in a subprocess: every threadgroup's threads are
//!    cooperative fibers on one OS thread, SIMD-groups of 32 lanes execute
//!    their collective operations in lockstep, and threadgroups run in
//!    parallel on all cores.
//!
//! Undefined behaviour that a simulator can see is reported as an error
//! instead of producing a plausible value: reading an inactive lane in a
//! shuffle, lanes of a SIMD-group reaching different collective operations,
//! a threadgroup barrier that some threads skip, accesses just past the end
//! of a buffer, and outputs that the kernel never writes (left as a poison
//! value, see [`HostTensor::poison_indices`]).
//!
//! ```no_run
//! use msl_sim::{run, HostTensor, KernelDesc, Launch, ScalarType};
//!
//! let desc = KernelDesc::new(
//!     "double_it",
//!     &["x"],
//!     &["y"],
//!     "uint i = thread_position_in_grid.x;\n y[i] = 2.0f * x[i];",
//! );
//! let x = HostTensor::from_f32(&[64], &(0..64).map(|i| i as f32).collect::<Vec<_>>());
//! let launch = Launch::new(vec![(vec![64], ScalarType::F32)], [64, 1, 1], [32, 1, 1]);
//! let y = run(&desc, &[x], &launch).unwrap();
//! assert_eq!(y[0].to_f32_vec()[3], 6.0);
//! ```
//!
//! See the crate's README for the supported MSL subset, environment
//! variables and limits.

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod codegen;
mod compile;
mod exec;
mod tensor;

use std::time::Instant;

pub use tensor::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, Element, HostTensor, ScalarType,
};

/// The arguments of `mx.fast.metal_kernel(...)`: a kernel body and how to wrap it.
#[derive(Clone, Debug)]
pub struct KernelDesc {
    /// Kernel name (the function is named `custom_kernel_<name>...`).
    pub name: String,
    /// Names of the input buffers, in order.
    pub input_names: Vec<String>,
    /// Names of the output buffers, in order.
    pub output_names: Vec<String>,
    /// The kernel body (MSL).
    pub source: String,
    /// Text placed before the kernel (helper functions, constants, includes).
    pub header: String,
    /// MLX copies non-row-contiguous inputs when set. Host tensors are always
    /// row contiguous, so this changes nothing here; it is kept for parity.
    pub ensure_row_contiguous: bool,
    /// Outputs are declared `device atomic<T>*`.
    pub atomic_outputs: bool,
}

impl KernelDesc {
    /// A description with an empty header, `ensure_row_contiguous = true`
    /// (MLX's default) and non-atomic outputs.
    pub fn new(name: &str, input_names: &[&str], output_names: &[&str], source: &str) -> Self {
        KernelDesc {
            name: name.to_string(),
            input_names: input_names.iter().map(|s| s.to_string()).collect(),
            output_names: output_names.iter().map(|s| s.to_string()).collect(),
            source: source.to_string(),
            header: String::new(),
            ensure_row_contiguous: true,
            atomic_outputs: false,
        }
    }

    /// Sets the header.
    pub fn with_header(mut self, header: &str) -> Self {
        self.header = header.to_string();
        self
    }
}

/// A template argument of the kernel (`int`, `bool` or `typename` parameter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TemplateArg {
    /// An `int` template parameter.
    Int(i32),
    /// A `bool` template parameter.
    Bool(bool),
    /// A `typename` template parameter bound to an element type.
    Dtype(ScalarType),
}

/// The per-call arguments of an MLX custom kernel.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Shape and element type of each output.
    pub outputs: Vec<(Vec<usize>, ScalarType)>,
    /// Grid size in threads (Metal `dispatchThreads`).
    pub grid: [usize; 3],
    /// Threadgroup size (clamped to the grid per dimension, as MLX does).
    pub threadgroup: [usize; 3],
    /// Template arguments, in order.
    pub template_args: Vec<(String, TemplateArg)>,
    /// Value every output element is set to before the kernel runs; without
    /// it outputs start as a poison value (NaN / `0xDEADBEEF` bytes).
    pub init_value: Option<f32>,
    /// Print the generated MSL source to stdout (like MLX's `verbose`).
    pub verbose: bool,
}

impl Launch {
    /// A launch without template arguments, `init_value` or `verbose`.
    pub fn new(outputs: Vec<(Vec<usize>, ScalarType)>, grid: [usize; 3], threadgroup: [usize; 3]) -> Self {
        Launch { outputs, grid, threadgroup, template_args: Vec::new(), init_value: None, verbose: false }
    }

    /// Appends a template argument.
    pub fn template(mut self, name: &str, arg: TemplateArg) -> Self {
        self.template_args.push((name.to_string(), arg));
        self
    }

    /// Sets `init_value`.
    pub fn init_value(mut self, v: f32) -> Self {
        self.init_value = Some(v);
        self
    }
}

/// Why a simulated kernel did not produce outputs.
#[derive(Debug)]
pub enum SimError {
    /// The arguments are inconsistent (counts, sizes, names, ...).
    InvalidArgument(String),
    /// The generated C++ did not compile. Unsupported MSL features fail here
    /// with a message naming them.
    Compile {
        /// Kernel function name.
        kernel: String,
        /// The compiler command used.
        compiler: String,
        /// The compiler's diagnostics.
        stderr: String,
        /// Where the generated source was kept for inspection.
        source_path: std::path::PathBuf,
    },
    /// The kernel failed while running: undefined behaviour detected by the
    /// simulator (message from the runtime), a fault, or a timeout.
    Runtime {
        /// Kernel function name.
        kernel: String,
        /// What went wrong.
        message: String,
    },
    /// A file or process operation failed.
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::InvalidArgument(m) => write!(f, "msl-sim: invalid argument: {m}"),
            SimError::Compile { kernel, compiler, stderr, source_path } => write!(
                f,
                "msl-sim: `{kernel}` failed to compile with `{compiler}` (generated source: {}):\n{stderr}",
                source_path.display()
            ),
            SimError::Runtime { kernel, message } => {
                write!(f, "msl-sim: `{kernel}` failed while running: {message}")
            }
            SimError::Io { context, source } => write!(f, "msl-sim: {context}: {source}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Outputs of [`run_with_report`] with timing information.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The output tensors, in the order of `output_names`.
    pub outputs: Vec<HostTensor>,
    /// Whether the executable came from the cache.
    pub cached: bool,
    /// Seconds spent compiling (0 when cached).
    pub compile_seconds: f64,
    /// Seconds spent running the kernel process (including file I/O).
    pub run_seconds: f64,
}

/// Runs the kernel on the CPU and returns its outputs (in the order of
/// `desc.output_names`).
pub fn run(desc: &KernelDesc, inputs: &[HostTensor], launch: &Launch) -> Result<Vec<HostTensor>, SimError> {
    run_with_report(desc, inputs, launch).map(|r| r.outputs)
}

/// Like [`run`], also reporting compile and run times.
pub fn run_with_report(desc: &KernelDesc, inputs: &[HostTensor], launch: &Launch) -> Result<RunReport, SimError> {
    validate(desc, inputs, launch)?;
    let generated = codegen::generate(desc, inputs, launch);
    if launch.verbose {
        println!("Generated source code for `{}`:\n```\n{}\n```", desc.name, generated.msl_source);
    }
    let built = compile::build(&generated.kernel_name, &generated.cpp_source)?;
    let mut outputs: Vec<HostTensor> = launch
        .outputs
        .iter()
        .map(|(shape, dtype)| match launch.init_value {
            Some(v) => HostTensor::filled(*dtype, shape, v),
            None => HostTensor::poisoned(*dtype, shape),
        })
        .collect();
    let start = Instant::now();
    exec::execute(&built.exe, &generated.kernel_name, launch.grid, launch.threadgroup, inputs, &mut outputs)?;
    Ok(RunReport {
        outputs,
        cached: built.cached,
        compile_seconds: built.compile_seconds,
        run_seconds: start.elapsed().as_secs_f64(),
    })
}

fn validate(desc: &KernelDesc, inputs: &[HostTensor], launch: &Launch) -> Result<(), SimError> {
    let err = |m: String| Err(SimError::InvalidArgument(m));
    if desc.output_names.is_empty() {
        return err("at least one output is required".into());
    }
    if inputs.len() != desc.input_names.len() {
        return err(format!("{} input names but {} inputs", desc.input_names.len(), inputs.len()));
    }
    if launch.outputs.len() != desc.output_names.len() {
        return err(format!(
            "{} output names but {} output shapes/dtypes",
            desc.output_names.len(),
            launch.outputs.len()
        ));
    }
    for (name, t) in desc.input_names.iter().zip(inputs) {
        let want = t.numel() * t.dtype.size_bytes();
        if t.data.len() != want {
            return err(format!(
                "input `{name}`: shape {:?} of {:?} needs {want} bytes, has {}",
                t.shape,
                t.dtype,
                t.data.len()
            ));
        }
        if t.shape.iter().any(|&d| d > i32::MAX as usize) {
            return err(format!("input `{name}`: dimension does not fit MLX's int shape"));
        }
    }
    if desc.atomic_outputs {
        for (name, (_, dtype)) in desc.output_names.iter().zip(&launch.outputs) {
            if !matches!(dtype, ScalarType::F32 | ScalarType::I32 | ScalarType::U32 | ScalarType::U64) {
                return err(format!("atomic output `{name}` of type {dtype:?} is not supported"));
            }
        }
    }
    for (what, dims) in [("grid", launch.grid), ("threadgroup", launch.threadgroup)] {
        if dims.iter().any(|&d| d == 0 || d > u32::MAX as usize) {
            return err(format!("{what} {dims:?} must have dimensions in 1..=2^32-1"));
        }
    }
    let tg: usize = launch.threadgroup.iter().product();
    if tg > 1024 {
        // MLX checks the requested size (before clamping) against the
        // pipeline's limit, which is at most 1024 on Apple GPUs.
        return err(format!("threadgroup size {tg} exceeds the maximum of 1024 threads"));
    }
    if !is_identifier(&desc.name) {
        return err(format!("kernel name `{}` is not an identifier", desc.name));
    }
    for n in desc.input_names.iter().chain(&desc.output_names) {
        if !is_identifier(n) {
            return err(format!("buffer name `{n}` is not an identifier"));
        }
    }
    for (n, arg) in &launch.template_args {
        if !is_identifier(n) {
            return err(format!("template parameter name `{n}` is not an identifier"));
        }
        if let TemplateArg::Int(v) = arg {
            if *v < 0 {
                // MLX appends the template arguments to the Metal function name
                // verbatim, so a '-' would make the generated name invalid.
                return err(format!(
                    "template argument {n} = {v}: MLX builds the kernel function name from the \
                     template arguments, and a negative value makes it an invalid identifier"
                ));
            }
        }
    }
    Ok(())
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Maps an I/O error to [`SimError::Io`] with `context`.
pub(crate) fn io_err(context: String) -> impl FnOnce(std::io::Error) -> SimError {
    move |source| SimError::Io { context, source }
}
