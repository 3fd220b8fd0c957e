//! What a kernel is and how one application runs: [`KernelSource`] and [`LaunchConfig`] (the
//! arguments of MLX's `metal_kernel` / `cuda_kernel` and of their apply), checked before any
//! reaches mlx-c.

use std::collections::HashSet;
use std::ffi::c_int;

use crate::dtype::Dtype;
use crate::error::{invalid, Result};

/// What a kernel is: its name, argument names and source text (the arguments of MLX's
/// `metal_kernel` / `cuda_kernel`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// Kernel name; MLX caches compiled kernels by it (plus the template arguments), never by
    /// source, so give each distinct source its own name.
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

    pub(crate) fn validate(&self, what: &str) -> Result<()> {
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
    pub(crate) fn check_input_count(&self, inputs: usize, backend: &str) -> Result<()> {
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

/// FNV-1a over several strings, each ended by a 0xff byte (stable across Rust releases, unlike
/// `DefaultHasher`): the hash that kernel names carry of the text they name.
pub(crate) fn fnv1a(parts: &[&str]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
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
    pub(crate) fn validate(&self, source: &KernelSource, inputs: usize, backend: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("x_2"));
        assert!(is_identifier("_T"));
        assert!(!is_identifier("2x"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
    }
}
