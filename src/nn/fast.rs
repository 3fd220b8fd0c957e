//! MLX's fused decoder kernels (`mlx::core::fast`): RMSNorm, rotary position embedding and
//! scaled dot-product attention.

use std::ffi::{c_int, CString};

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::error::{invalid, Result};

/// `x / sqrt(mean(x², last axis) + eps) · weight`, with `weight` of the last axis' length.
pub fn rms_norm(x: &MlxArray, weight: &MlxArray, eps: f32) -> Result<MlxArray> {
    let last = x.shape().last().copied();
    if weight.shape().len() != 1 || Some(weight.shape()[0]) != last {
        invalid!(
            "rms_norm: weight of shape {:?} for input of shape {:?} (one weight per last-axis entry)",
            weight.shape(),
            x.shape()
        );
    }
    if !(eps.is_finite() && eps > 0.0) {
        invalid!("rms_norm: eps must be finite and positive, got {eps}");
    }
    // SAFETY: both handles are live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_fast_rms_norm(res, x.as_raw(), weight.as_raw(), eps, s) })
}

/// Rotary position embedding of the first `dims` entries of the last axis of `x` (`[.., L, D]`):
/// position `offset + l` for row `l` of the second-to-last axis, frequencies
/// `base^(-2i/dims)`, positions multiplied by `scale`. `traditional` rotates adjacent pairs
/// `(2i, 2i+1)` (the layout llama.cpp's converter leaves Llama's Q/K rows in); otherwise the
/// halves `(i, i + dims/2)` are rotated together.
pub fn rope(x: &MlxArray, dims: usize, traditional: bool, base: f32, scale: f32, offset: usize) -> Result<MlxArray> {
    let shape = x.shape();
    if shape.len() < 2 {
        invalid!("rope: input of shape {shape:?} needs at least [positions, features]");
    }
    let last = shape[shape.len() - 1];
    if dims == 0 || !dims.is_multiple_of(2) || dims > last {
        invalid!("rope: dims {dims} must be even, positive and at most the last axis ({last})");
    }
    if !(base.is_finite() && base > 0.0 && scale.is_finite()) {
        invalid!("rope: base {base} must be finite and positive, scale {scale} finite");
    }
    let (Ok(dims), Ok(offset)) = (c_int::try_from(dims), c_int::try_from(offset)) else {
        invalid!("rope: dims {dims} or offset {offset} exceeds MLX's int range");
    };
    let base = sys::mlx_optional_float { value: base, has_value: true };
    let no_freqs = MlxArray::empty();
    // SAFETY: the handles are live (`no_freqs` is the empty handle mlx-c reads as "no custom
    // frequencies") for the duration of the call.
    MlxArray::op(|res, s| unsafe {
        sys::mlx_fast_rope(res, x.as_raw(), dims, traditional, base, scale, offset, no_freqs.as_raw(), s)
    })
}

/// Which keys each query of [`scaled_dot_product_attention`] may see.
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every key.
    None,
    /// Keys up to the query's own position, the queries being the last positions of the keys
    /// (query `i` of `L` sees keys `0 ..= i + S − L` of `S`): prefill and cached decoding alike.
    Causal,
    /// An additive (float) or boolean (true = may attend) mask broadcastable to
    /// `[B, heads, L, S]`.
    Array(&'a MlxArray),
}

/// `softmax(q · kᵀ · scale + mask) · v` with `q` `[B, Hq, L, D]`, `k` and `v` `[B, Hkv, S, D]`;
/// `Hq` a multiple of `Hkv` (grouped-query attention: each key/value head serves `Hq / Hkv`
/// query heads). Returns `[B, Hq, L, D]`.
pub fn scaled_dot_product_attention(
    q: &MlxArray,
    k: &MlxArray,
    v: &MlxArray,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<MlxArray> {
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
        invalid!("attention: q {qs:?}, k {ks:?}, v {vs:?} must all be [batch, heads, positions, head_dim]");
    }
    if ks != vs || qs[0] != ks[0] || qs[3] != ks[3] || ks[1] == 0 || qs[1] % ks[1] != 0 {
        invalid!("attention: q {qs:?}, k {ks:?}, v {vs:?}: k and v must agree, batch and head_dim match q, and q's heads be a multiple of k's");
    }
    if !scale.is_finite() {
        invalid!("attention: scale must be finite, got {scale}");
    }
    let (mode, array) = match mask {
        AttentionMask::None => ("", MlxArray::empty()),
        AttentionMask::Causal => ("causal", MlxArray::empty()),
        AttentionMask::Array(a) => ("array", a.clone()),
    };
    let mode = CString::new(mode).expect("no NUL");
    let no_sinks = MlxArray::empty();
    // SAFETY: all handles are live (empty handles read as "none") and `mode` is NUL-terminated
    // for the duration of the call.
    MlxArray::op(|res, s| unsafe {
        sys::mlx_fast_scaled_dot_product_attention(
            res,
            q.as_raw(),
            k.as_raw(),
            v.as_raw(),
            scale,
            mode.as_ptr(),
            array.as_raw(),
            no_sinks.as_raw(),
            false,
            s,
        )
    })
}
