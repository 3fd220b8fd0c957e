//! Running [`MetalKernel`]s on `msl-sim`, a CPU simulator of MLX's Metal kernel wrapping (the
//! `metal-sim` feature).
//!
//! While a [`MetalSimScope`] lives on a thread, [`MetalKernel::apply`] on that thread evaluates
//! its inputs, copies them to the host, runs the exact kernel text (body, header, template
//! arguments, grid, threadgroup) on the simulator and returns the outputs as evaluated arrays.
//! Everything else (MLX operations before and after the kernel) runs as usual.

use std::cell::Cell;
use std::marker::PhantomData;

use half::{bf16, f16};
use msl_sim::{HostTensor, KernelDesc, Launch, ScalarType};

use crate::array::MlxArray;
use crate::dtype::{Dtype, Element};
use crate::error::{invalid, Error, Result};
use crate::kernel::{LaunchConfig, MetalKernel, TemplateArg};

thread_local! {
    /// How many scopes are open on this thread.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether a [`MetalSimScope`] is open on this thread.
pub(crate) fn active() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// A guard: while it lives, [`MetalKernel::apply`] on this thread runs on the CPU simulator
/// instead of Metal. Scopes nest; the simulator stays on until the outermost one is dropped.
/// The guard belongs to the thread that opened it (it is neither `Send` nor `Sync`).
///
/// ```no_run
/// # fn main() -> mlx_trellis::Result<()> {
/// let _sim = mlx_trellis::MetalSimScope::enter();
/// // Metal kernels applied here run on the simulator.
/// # Ok(())
/// # }
/// ```
#[must_use = "the simulator is on only while the scope lives"]
pub struct MetalSimScope {
    // Thread-bound: the depth counter is per thread.
    _not_send: PhantomData<*const ()>,
}

impl MetalSimScope {
    /// Opens a scope on this thread.
    pub fn enter() -> MetalSimScope {
        DEPTH.with(|d| d.set(d.get() + 1));
        MetalSimScope { _not_send: PhantomData }
    }
}

impl Drop for MetalSimScope {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn scalar_type(dtype: Dtype) -> Result<ScalarType> {
    Ok(match dtype {
        Dtype::Bool => ScalarType::Bool,
        Dtype::Uint8 => ScalarType::U8,
        Dtype::Uint16 => ScalarType::U16,
        Dtype::Uint32 => ScalarType::U32,
        Dtype::Uint64 => ScalarType::U64,
        Dtype::Int8 => ScalarType::I8,
        Dtype::Int16 => ScalarType::I16,
        Dtype::Int32 => ScalarType::I32,
        Dtype::Int64 => ScalarType::I64,
        Dtype::Float16 => ScalarType::F16,
        Dtype::Bfloat16 => ScalarType::BF16,
        Dtype::Float32 => ScalarType::F32,
        Dtype::Float64 | Dtype::Complex64 => invalid!("the Metal simulator has no {dtype} (Metal has none either)"),
    })
}

/// The elements of `a` (evaluated, row-major) as a host tensor.
fn to_host(a: &MlxArray) -> Result<HostTensor> {
    fn tensor<T: Element + msl_sim::Element>(a: &MlxArray) -> Result<HostTensor> {
        Ok(HostTensor::from_slice(&a.shape(), &a.to_vec::<T>()?))
    }
    // 16-bit floats travel as their bit patterns.
    fn bits16<T: Element>(a: &MlxArray, st: ScalarType, to_bits: fn(T) -> u16) -> Result<HostTensor> {
        let bits: Vec<u16> = a.to_vec::<T>()?.into_iter().map(to_bits).collect();
        Ok(HostTensor::from_bits_u16(st, &a.shape(), &bits))
    }
    match a.dtype() {
        Dtype::Bool => tensor::<bool>(a),
        Dtype::Uint8 => tensor::<u8>(a),
        Dtype::Uint16 => tensor::<u16>(a),
        Dtype::Uint32 => tensor::<u32>(a),
        Dtype::Uint64 => tensor::<u64>(a),
        Dtype::Int8 => tensor::<i8>(a),
        Dtype::Int16 => tensor::<i16>(a),
        Dtype::Int32 => tensor::<i32>(a),
        Dtype::Int64 => tensor::<i64>(a),
        Dtype::Float32 => tensor::<f32>(a),
        Dtype::Float16 => bits16(a, ScalarType::F16, f16::to_bits),
        Dtype::Bfloat16 => bits16(a, ScalarType::BF16, bf16::to_bits),
        d @ (Dtype::Float64 | Dtype::Complex64) => invalid!("a Metal kernel input cannot be {d}"),
    }
}

/// A host tensor as an MLX array of the same type and shape.
fn from_host(t: &HostTensor) -> Result<MlxArray> {
    fn array<T: Element + msl_sim::Element>(t: &HostTensor) -> Result<MlxArray> {
        MlxArray::from_slice(&t.to_vec::<T>(), &t.shape)
    }
    match t.dtype {
        ScalarType::Bool => array::<bool>(t),
        ScalarType::U8 => array::<u8>(t),
        ScalarType::U16 => array::<u16>(t),
        ScalarType::U32 => array::<u32>(t),
        ScalarType::U64 => array::<u64>(t),
        ScalarType::I8 => array::<i8>(t),
        ScalarType::I16 => array::<i16>(t),
        ScalarType::I32 => array::<i32>(t),
        ScalarType::I64 => array::<i64>(t),
        ScalarType::F32 => array::<f32>(t),
        ScalarType::F16 => {
            MlxArray::from_slice(&t.to_bits_u16_vec().into_iter().map(f16::from_bits).collect::<Vec<_>>(), &t.shape)
        }
        ScalarType::BF16 => {
            MlxArray::from_slice(&t.to_bits_u16_vec().into_iter().map(bf16::from_bits).collect::<Vec<_>>(), &t.shape)
        }
    }
}

/// [`MetalKernel::apply`] on the simulator: evaluates and copies the inputs, runs the kernel and
/// returns its outputs (already evaluated).
pub(crate) fn apply(kernel: &MetalKernel, inputs: &[&MlxArray], cfg: &LaunchConfig) -> Result<Vec<MlxArray>> {
    let src = kernel.source();
    let desc = KernelDesc {
        name: src.name.clone(),
        input_names: src.input_names.clone(),
        output_names: src.output_names.clone(),
        source: src.source.clone(),
        header: src.header.clone(),
        ensure_row_contiguous: src.ensure_row_contiguous,
        atomic_outputs: kernel.atomic_outputs(),
    };
    let hosts = inputs.iter().map(|a| to_host(a)).collect::<Result<Vec<_>>>()?;
    let outputs =
        cfg.outputs.iter().map(|o| Ok((o.shape.clone(), scalar_type(o.dtype)?))).collect::<Result<Vec<_>>>()?;
    let mut launch = Launch::new(outputs, cfg.grid, cfg.thread_group);
    for (name, value) in &cfg.template_args {
        let arg = match *value {
            TemplateArg::Dtype(d) => msl_sim::TemplateArg::Dtype(scalar_type(d)?),
            TemplateArg::Int(i) => msl_sim::TemplateArg::Int(i),
            TemplateArg::Bool(b) => msl_sim::TemplateArg::Bool(b),
        };
        launch = launch.template(name, arg);
    }
    launch.init_value = cfg.init_value;
    launch.verbose = cfg.verbose;
    let outs = msl_sim::run(&desc, &hosts, &launch)
        .map_err(|e| Error::mlx(format!("simulating Metal kernel {:?}: {e}", src.name)))?;
    outs.iter().map(from_host).collect()
}
