//! One linear layer of the decoder, in whichever form it is stored: dense, MLX affine-quantized
//! (as a GGUF ships it or re-quantized) or trellis-coded.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::io::gguf::GgufTensor;
use crate::ops::{quantize, quantized_matmul};
use crate::trellis::TrellisLinear;

/// A linear layer `y = x · Wᵀ` with `W` `[out, in]`.
#[derive(Clone)]
pub enum Linear {
    /// Dense weights, stored transposed (`[in, out]`, row-major) in the activation dtype: the
    /// CPU's matrix product runs about twice as fast on a contiguous right operand as on a
    /// transposed view.
    Dense(MlxArray),
    /// MLX affine-quantized weights (`W = scales · q + biases` per group of inputs).
    Affine {
        /// Packed weights (`uint32`, `[out, in · bits / 32]`).
        weight: MlxArray,
        /// One scale per group (`[out, in / group_size]`, in the activation dtype).
        scales: MlxArray,
        /// One bias per group (as `scales`).
        biases: MlxArray,
        /// Inputs per group.
        group_size: i32,
        /// Bits per weight.
        bits: i32,
        /// `[out, in]`.
        shape: [usize; 2],
    },
    /// Trellis-coded weights; the layer applies any rotation or padding its artifact records.
    Trellis(TrellisLinear),
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Linear::Dense(wt) => write!(f, "Dense(transposed {:?} {})", wt.shape(), wt.dtype()),
            Linear::Affine { bits, group_size, shape, .. } => {
                write!(f, "Affine({bits} bits, groups of {group_size}, {shape:?})")
            }
            Linear::Trellis(t) => write!(f, "Trellis({}, {})", t.name(), t.geometry()),
        }
    }
}

impl Linear {
    /// The layer as a GGUF tensor holds it: dense tensors converted to `dtype`, quantized ones
    /// kept as MLX affine weights with their scales and biases in `dtype`.
    pub fn from_gguf(tensor: GgufTensor, dtype: Dtype) -> Result<Linear> {
        match tensor {
            GgufTensor::Dense(w) => {
                if w.ndim() != 2 {
                    invalid!("a linear layer's weight must be 2-D, got {:?}", w.shape());
                }
                Linear::dense(&w, dtype)
            }
            GgufTensor::Affine { weight, scales, biases, group_size, bits } => {
                let (ws, ss) = (weight.shape(), scales.shape());
                if ws.len() != 2 || ss.len() != 2 {
                    invalid!("a linear layer's weight must be 2-D, got packed {ws:?} and scales {ss:?}");
                }
                let shape = [ss[0], ss[1] * group_size as usize];
                Ok(Linear::Affine {
                    weight,
                    scales: scales.astype(dtype)?,
                    biases: biases.astype(dtype)?,
                    group_size,
                    bits,
                    shape,
                })
            }
        }
    }

    /// Dense weights `w` (`[out, in]`) in `dtype`.
    pub fn dense(w: &MlxArray, dtype: Dtype) -> Result<Linear> {
        if w.ndim() != 2 {
            invalid!("a linear layer's weight must be 2-D, got {:?}", w.shape());
        }
        Ok(Linear::Dense(w.astype(dtype)?.t()?.contiguous()?))
    }

    /// Dense weights `w` (`[out, in]`) quantized by MLX's affine quantization at `bits` per weight
    /// and `group_size` inputs per scale and bias; scales and biases in `dtype`.
    pub fn affine_from_dense(w: &MlxArray, bits: i32, group_size: i32, dtype: Dtype) -> Result<Linear> {
        let shape = w.shape();
        if shape.len() != 2 {
            invalid!("affine quantization needs a 2-D weight, got {shape:?}");
        }
        let (weight, scales, biases) = quantize(&w.astype(Dtype::Float32)?, group_size, bits)?;
        Ok(Linear::Affine {
            weight,
            scales: scales.astype(dtype)?,
            biases: biases.astype(dtype)?,
            group_size,
            bits,
            shape: [shape[0], shape[1]],
        })
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Linear::Dense(wt) => {
                let s = wt.shape();
                [s[1], s[0]]
            }
            Linear::Affine { shape, .. } => *shape,
            Linear::Trellis(t) => [t.out_features(), t.in_features()],
        }
    }

    /// `x · Wᵀ` over the last axis of `x` (`[.., in]` → `[.., out]`, in `x`'s dtype).
    pub fn forward(&self, x: &MlxArray) -> Result<MlxArray> {
        match self {
            Linear::Dense(wt) => x.matmul(wt),
            Linear::Affine { weight, scales, biases, group_size, bits, .. } => {
                quantized_matmul(x, weight, scales, biases, true, *group_size, *bits)
            }
            Linear::Trellis(t) => t.forward(x),
        }
    }

    /// `residual + x · Wᵀ` (`residual` of the output's shape): a coded layer's
    /// [`TrellisLinear::forward_residual`] (on CUDA the add in its kernel), MLX's add after the
    /// product otherwise.
    pub fn forward_residual(&self, x: &MlxArray, residual: &MlxArray) -> Result<MlxArray> {
        match self {
            Linear::Trellis(t) => t.forward_residual(x, residual),
            _ => residual.add(&self.forward(x)?),
        }
    }

    /// Stored bits (weights, scales and biases or code words and row scales) and the number of
    /// logical weights (`out · in`) they encode.
    pub fn stored_bits(&self) -> (u64, u64) {
        let [out, inp] = self.shape();
        let weights = (out * inp) as u64;
        let bits = match self {
            Linear::Dense(w) => weights * dtype_bits(w.dtype()),
            // One scale and one bias per group, each stored in 16 bits.
            Linear::Affine { bits, group_size, .. } => weights * *bits as u64 + weights / *group_size as u64 * 32,
            // The code words plus one 16-bit scale per stored row and, where rotated, one 16-bit
            // sign per logical column of the coded axis.
            Linear::Trellis(t) => {
                let signs = t.rotation().map_or(0, |r| r.len() as u64);
                t.codes().size() as u64 * 32 + t.scales().size() as u64 * 16 + signs * 16
            }
        };
        (bits, weights)
    }

    /// [`stored_bits`](Linear::stored_bits) per logical weight.
    pub fn bits_per_weight(&self) -> f64 {
        let (bits, weights) = self.stored_bits();
        bits as f64 / weights as f64
    }
}

fn dtype_bits(d: Dtype) -> u64 {
    match d {
        Dtype::Float64 | Dtype::Int64 | Dtype::Uint64 | Dtype::Complex64 => 64,
        Dtype::Float32 | Dtype::Int32 | Dtype::Uint32 => 32,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Int16 | Dtype::Uint16 => 16,
        Dtype::Int8 | Dtype::Uint8 | Dtype::Bool => 8,
    }
}
