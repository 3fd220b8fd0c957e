//! The run-time side of a layer's coded axis (docs/format.md §10) on MLX: the rotation `x · Q` of the
//! activations of an axis-1 layer and their zero padding to the stored columns, and for an axis-0
//! layer the slice of its output to the logical columns and the inverse rotation `y · Qᵀ`.
//!
//! Rotations run in f32 whatever the activation dtype (MLX's `hadamard_transform` on a blocked
//! view `[m, n / b, b]` with scale `1/√b`, and one elementwise multiply by the signs), then the
//! result is cast back to the activation dtype. On MLX's CUDA back-end a layer's rotation, with
//! its padding or slice, is one launch of the rotation kernel instead (`cuda::rotate`: the same
//! arithmetic in the same order, so the same bits).

use crate::array::MlxArray;
use crate::device::{backend, Backend, Stream};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::nn::hadamard_transform;
use crate::ops::concatenate;

use super::cuda::down::OutputRotation;
use super::cuda::rotate::{self as cuda_rotate, Direction};
use super::cuda::swiglu_rotate::Side;
use super::format::TrellisGeometry;
use super::rotation::{CodedAxis, Rotation};

/// A rotation's signs on the device, with its block.
#[derive(Clone)]
struct DeviceRotation {
    /// f32 `[n]`.
    signs: MlxArray,
    block: usize,
}

impl DeviceRotation {
    fn new(r: &Rotation) -> Result<DeviceRotation> {
        Ok(DeviceRotation { signs: MlxArray::from_slice(r.signs(), &[r.len()])?, block: r.block() })
    }

    /// Each block of `b` entries of `x2f` `[m, n]` (f32) times `H_b / √b`.
    fn blocks(&self, x2f: &MlxArray) -> Result<MlxArray> {
        let shape = x2f.shape();
        let (m, n) = (shape[0], shape[1]);
        let b = self.block;
        let blocked = x2f.reshape(&[m, n / b, b])?;
        hadamard_transform(&blocked, 1.0 / (b as f32).sqrt())?.reshape(&[m, n])
    }

    /// `x2 · Q` in f32.
    fn rotate(&self, x2f: &MlxArray) -> Result<MlxArray> {
        self.blocks(&x2f.multiply(&self.signs)?)
    }

    /// `y2 · Qᵀ` in f32.
    fn inverse(&self, y2f: &MlxArray) -> Result<MlxArray> {
        self.blocks(y2f)?.multiply(&self.signs)
    }
}

/// Checks `x` `[m, n]` against a rotation of `n` entries.
fn check_rows(what: &str, x: &MlxArray, n: usize) -> Result<usize> {
    match x.shape()[..] {
        [m, cols] if cols == n => Ok(m),
        ref s => invalid!("{what}: expected [M, {n}], got {s:?}"),
    }
}

/// `x · Q` for `x` `[m, n]` (any float dtype; computed in f32, returned in `x`'s dtype).
pub fn rotate(x: &MlxArray, rotation: &Rotation) -> Result<MlxArray> {
    check_rows("rotate", x, rotation.len())?;
    DeviceRotation::new(rotation)?.rotate(&x.astype(Dtype::Float32)?)?.astype(x.dtype())
}

/// `y · Qᵀ` for `y` `[m, n]` (the inverse of [`rotate`]).
pub fn inverse_rotate(y: &MlxArray, rotation: &Rotation) -> Result<MlxArray> {
    check_rows("inverse_rotate", y, rotation.len())?;
    DeviceRotation::new(rotation)?.inverse(&y.astype(Dtype::Float32)?)?.astype(y.dtype())
}

/// What a layer applies around its stored matrix at run time (built once per layer).
#[derive(Clone)]
pub(crate) struct AxisTransform {
    host: CodedAxis,
    rotation: Option<DeviceRotation>,
    axis: u32,
    stored: usize,
    /// The loaded MLX runs CUDA kernels: rotations go to the rotation kernel.
    cuda: bool,
}

impl AxisTransform {
    /// The transform of `axis` for geometry `g` (checked), or `None` where nothing applies.
    pub(crate) fn new(axis: CodedAxis, g: &TrellisGeometry) -> Result<Option<AxisTransform>> {
        axis.check(g.cols, g.t as usize)?;
        if axis.is_identity(g.cols) {
            return Ok(None);
        }
        let rotation = axis.rotation.as_ref().map(DeviceRotation::new).transpose()?;
        Ok(Some(AxisTransform { host: axis, rotation, axis: g.axis, stored: g.cols, cuda: backend() == Backend::Cuda }))
    }

    /// Whether `r` runs as the CUDA rotation kernel for activations of `dtype`: on a CUDA build,
    /// when this thread's operations go to the GPU (a CPU stream keeps MLX's operations).
    fn on_cuda(&self, r: &DeviceRotation, dtype: Dtype) -> bool {
        self.cuda_serves(r, dtype) && Stream::current_is_gpu()
    }

    /// Whether the CUDA kernels serve `r` for activations of `dtype` on this build.
    fn cuda_serves(&self, r: &DeviceRotation, dtype: Dtype) -> bool {
        self.cuda && cuda_rotate::serves(dtype, r.block)
    }

    /// This transform as one side of the CUDA SwiGLU with rotations (`cuda::swiglu_rotate`), for
    /// activations of `dtype`: the stored columns and the rotation, or `None` where its kernel
    /// does not serve the rotation. The caller has checked that this thread's operations go to
    /// the GPU (once for all three sides).
    pub(crate) fn cuda_side(&self, dtype: Dtype) -> Option<Side<'_>> {
        let rotation = match &self.rotation {
            Some(r) if !self.cuda_serves(r, dtype) => return None,
            Some(r) => Some((&r.signs, r.block)),
            None => None,
        };
        Some(Side { stored: self.stored, rotation })
    }

    /// The output rotation of an axis-0 layer as the CUDA down kernel's fold takes it, for
    /// activations of `dtype`; `None` for an axis-1 layer, a layer without a rotation, or where
    /// the rotation kernel would not run it (another back-end, a CPU stream, a block it does not
    /// serve).
    pub(crate) fn cuda_output_rotation(&self, dtype: Dtype) -> Option<OutputRotation<'_>> {
        let r = self.rotation.as_ref().filter(|r| self.axis == 0 && self.on_cuda(r, dtype))?;
        Some(OutputRotation { signs: &r.signs, logical: self.host.logical, block: r.block })
    }

    /// The host description.
    pub(crate) fn host(&self) -> &CodedAxis {
        &self.host
    }

    /// The activations the stored matrix takes: for axis 1, `x2 · Q` padded with zero columns to
    /// the stored columns; for axis 0, `x2` itself.
    pub(crate) fn stored_input(&self, x2: &MlxArray) -> Result<MlxArray> {
        if self.axis != 1 {
            return Ok(x2.clone());
        }
        let dtype = x2.dtype();
        let x = match &self.rotation {
            Some(r) if self.on_cuda(r, dtype) => {
                let direction = Direction::Forward { stored: self.stored };
                return cuda_rotate::rotate_with_signs(x2, &r.signs, self.host.logical, r.block, direction);
            }
            Some(r) => r.rotate(&x2.astype(Dtype::Float32)?)?.astype(dtype)?,
            None => x2.clone(),
        };
        let pad = self.stored - self.host.logical;
        if pad == 0 {
            return Ok(x);
        }
        let zeros = MlxArray::zeros(&[x2.shape()[0], pad], dtype)?;
        concatenate(&[&x, &zeros], 1)
    }

    /// The layer's output from the stored matrix's `y2` `[m, stored out]`: for axis 0, the first
    /// logical columns times `Qᵀ`; for axis 1, `y2` itself.
    pub(crate) fn logical_output(&self, y2: &MlxArray) -> Result<MlxArray> {
        if self.axis != 0 {
            return Ok(y2.clone());
        }
        let dtype = y2.dtype();
        if let Some(r) = self.rotation.as_ref().filter(|r| self.on_cuda(r, dtype)) {
            let direction = Direction::Inverse { stored: self.stored };
            return cuda_rotate::rotate_with_signs(y2, &r.signs, self.host.logical, r.block, direction);
        }
        let m = y2.shape()[0];
        let y = if self.host.logical == self.stored {
            y2.clone()
        } else {
            let (m, n) = (i32::try_from(m), i32::try_from(self.host.logical));
            let (Ok(m), Ok(n)) = (m, n) else {
                invalid!("an output of [{:?}, {}] does not fit MLX's int", y2.shape()[0], self.host.logical);
            };
            y2.slice(&[0, 0], &[m, n], &[1, 1])?
        };
        match &self.rotation {
            Some(r) => r.inverse(&y.astype(Dtype::Float32)?)?.astype(dtype),
            None => Ok(y),
        }
    }
}
