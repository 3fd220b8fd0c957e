//! Gathering rows (embeddings), reductions over a vocabulary axis (argmax, softmax, logsumexp),
//! ordering (top-k, sort, cumulative sums) and seeded sampling.

use std::ffi::c_int;

use mlx_sys as sys;

use super::axis;
use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::ffi::call;

fn is_integer(d: Dtype) -> bool {
    !d.is_float() && !matches!(d, Dtype::Bool | Dtype::Complex64)
}

/// Rows `ids` (an integer array of any shape) of `table` (`[rows, ..]`): `[ids.., ..]`. Ids out
/// of range are refused (MLX would read past the table).
pub fn embedding(table: &MlxArray, ids: &MlxArray) -> Result<MlxArray> {
    if table.ndim() < 1 || !is_integer(ids.dtype()) {
        invalid!("embedding: table {:?} needs rows and ids an integer array (got {})", table.shape(), ids.dtype());
    }
    let rows = table.shape()[0];
    if ids.size() > 0 {
        let max = ids.max_all(false)?.item_f64()?;
        let min = ids.astype(Dtype::Int64)?.negative()?.max_all(false)?.item_f64()?;
        if min > 0.0 || max >= rows as f64 {
            invalid!("embedding: ids range over [{}, {max}], outside the table's {rows} rows", -min);
        }
    }
    table.take(ids, 0)
}

/// Index of the largest entry along `axis` (first on ties), `uint32`.
pub fn argmax(x: &MlxArray, axis_: i32, keepdims: bool) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "argmax")?;
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_argmax_axis(res, x.as_raw(), a, keepdims, s) })
}

/// Softmax along `axis`, computed in float32 for lower-precision inputs (MLX's `precise`).
pub fn softmax(x: &MlxArray, axis_: i32) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "softmax")?;
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_softmax_axis(res, x.as_raw(), a, true, s) })
}

/// `log Σ exp(x)` along `axis`, computed stably.
pub fn logsumexp(x: &MlxArray, axis_: i32, keepdims: bool) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "logsumexp")?;
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_logsumexp_axis(res, x.as_raw(), a, keepdims, s) })
}

/// `x − logsumexp(x)` along `axis`: log-probabilities from logits.
pub fn log_softmax(x: &MlxArray, axis_: i32) -> Result<MlxArray> {
    x.subtract(&logsumexp(x, axis_, true)?)
}

/// The `k` largest entries along `axis`, in no particular order.
pub fn topk(x: &MlxArray, k: usize, axis_: i32) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "topk")?;
    let n = x.shape()[a as usize];
    if k == 0 || k > n {
        invalid!("topk: k = {k} must be 1 to the axis length {n}");
    }
    let k = c_int::try_from(k).expect("at most an MLX dimension");
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_topk_axis(res, x.as_raw(), k, a, s) })
}

/// `x` sorted ascending along `axis`.
pub fn sort(x: &MlxArray, axis_: i32) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "sort")?;
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_sort_axis(res, x.as_raw(), a, s) })
}

/// The indices that sort `x` ascending along `axis` (`uint32`).
pub fn argsort(x: &MlxArray, axis_: i32) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "argsort")?;
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_argsort_axis(res, x.as_raw(), a, s) })
}

/// The entries of `x` at `indices` along `axis` (`indices` of `x`'s rank, as [`argsort`] gives).
pub fn take_along_axis(x: &MlxArray, indices: &MlxArray, axis_: i32) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "take_along_axis")?;
    if indices.ndim() != x.ndim() || !is_integer(indices.dtype()) {
        invalid!(
            "take_along_axis: indices {:?} ({}) must be integers of the rank of {:?}",
            indices.shape(),
            indices.dtype(),
            x.shape()
        );
    }
    // SAFETY: both handles are live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_take_along_axis(res, x.as_raw(), indices.as_raw(), a, s) })
}

/// Cumulative sum along `axis`: `inclusive` counts each entry in its own sum; `reverse` sums
/// from the end.
pub fn cumsum(x: &MlxArray, axis_: i32, reverse: bool, inclusive: bool) -> Result<MlxArray> {
    let a = axis(axis_, x.ndim(), "cumsum")?;
    let same_dtype = sys::mlx_optional_dtype { value: Dtype::Float32.to_raw(), has_value: false };
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_cumsum_axis(res, x.as_raw(), a, reverse, inclusive, same_dtype, s) })
}

/// Elementwise `a < b` as bool (broadcasting).
pub fn less(a: &MlxArray, b: &MlxArray) -> Result<MlxArray> {
    // SAFETY: both handles are live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_less(res, a.as_raw(), b.as_raw(), s) })
}

/// Elementwise `e^x`.
pub fn exp(x: &MlxArray) -> Result<MlxArray> {
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_exp(res, x.as_raw(), s) })
}

/// Elementwise natural logarithm.
pub fn log(x: &MlxArray) -> Result<MlxArray> {
    // SAFETY: the handle is live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_log(res, x.as_raw(), s) })
}

/// One index drawn along `axis` from the distribution `softmax(logits)` (entries of −∞ are never
/// drawn), with the key of `seed`: the same seed draws the same index on every backend.
pub fn categorical(logits: &MlxArray, axis_: i32, seed: u64) -> Result<MlxArray> {
    let a = axis(axis_, logits.ndim(), "categorical")?;
    let mut key = MlxArray::empty();
    // SAFETY: `key`'s handle slot is a valid out-pointer.
    call(|| unsafe { sys::mlx_random_key(key.raw_mut(), seed) })?;
    // SAFETY: both handles are live for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_random_categorical(res, logits.as_raw(), a, key.as_raw(), s) })
}
