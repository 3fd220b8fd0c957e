//! Operations on [`MlxArray`]: arithmetic, bit operations, reductions, shape changes, indexing,
//! random numbers and MLX's affine quantization. Each runs lazily on the thread's current stream
//! (see [`crate::device`]) and reports MLX's errors (broadcast mismatches, bad shapes, ...) as
//! `Err` values.

use std::ffi::{c_int, CString};

use mlx_sys as sys;

use crate::array::{dims, MlxArray};
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::ffi::call;

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self, other: &MlxArray) -> Result<MlxArray> {
            // SAFETY: both handles are live for the duration of the call.
            MlxArray::op(|res, s| unsafe { sys::$ffi(res, self.as_raw(), other.as_raw(), s) })
        }
    )*};
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Result<MlxArray> {
            // SAFETY: the handle is live for the duration of the call.
            MlxArray::op(|res, s| unsafe { sys::$ffi(res, self.as_raw(), s) })
        }
    )*};
}

/// Resolves `axes` against `ndim` (negative axes count from the end) and checks them.
fn axes(axes: &[i32], ndim: usize, what: &str) -> Result<Vec<c_int>> {
    axes.iter()
        .map(|&a| {
            let resolved = if a < 0 { a + ndim as i32 } else { a };
            if resolved < 0 || resolved as usize >= ndim {
                invalid!("{what}: axis {a} is out of range for an array of {ndim} dimensions");
            }
            Ok(resolved)
        })
        .collect()
}

impl MlxArray {
    binary_ops! {
        /// Elementwise `self + other` (broadcasting).
        add => mlx_add,
        /// Elementwise `self - other` (broadcasting).
        subtract => mlx_subtract,
        /// Elementwise `self * other` (broadcasting).
        multiply => mlx_multiply,
        /// Elementwise `self / other` (broadcasting; integer inputs give floats).
        divide => mlx_divide,
        /// Elementwise maximum.
        maximum => mlx_maximum,
        /// Elementwise `self == other` as bool.
        equal => mlx_equal,
        /// Elementwise bitwise AND (integers and bool).
        bitwise_and => mlx_bitwise_and,
        /// Elementwise bitwise OR (integers and bool).
        bitwise_or => mlx_bitwise_or,
        /// Elementwise bitwise XOR (integers and bool).
        bitwise_xor => mlx_bitwise_xor,
        /// Elementwise `self << other` (integers).
        left_shift => mlx_left_shift,
        /// Elementwise `self >> other` (integers; logical for unsigned types).
        right_shift => mlx_right_shift,
        /// Matrix product with NumPy semantics (batched over leading dimensions).
        matmul => mlx_matmul,
    }

    /// `self + a · b` (MLX's `addmm` with α = β = 1): on CUDA one cuBLAS call that adds `self`
    /// in its epilogue.
    pub fn addmm(&self, a: &MlxArray, b: &MlxArray) -> Result<MlxArray> {
        // SAFETY: all three handles are live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_addmm(res, self.as_raw(), a.as_raw(), b.as_raw(), 1.0, 1.0, s) })
    }

    unary_ops! {
        /// Elementwise negation.
        negative => mlx_negative,
        /// Elementwise absolute value.
        abs => mlx_abs,
        /// Elementwise square.
        square => mlx_square,
        /// Elementwise square root.
        sqrt => mlx_sqrt,
        /// Elementwise logistic sigmoid `1 / (1 + e^-x)`.
        sigmoid => mlx_sigmoid,
    }

    /// Elementwise SiLU `x * sigmoid(x)` (MLX's `nn.silu`).
    pub fn silu(&self) -> Result<MlxArray> {
        self.multiply(&self.sigmoid()?)
    }

    /// Sum over `axes` (negative axes count from the end); `keepdims` keeps them as size 1.
    pub fn sum_axes(&self, axes_: &[i32], keepdims: bool) -> Result<MlxArray> {
        let axes = axes(axes_, self.ndim(), "sum")?;
        // SAFETY: `axes` is live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe { sys::mlx_sum_axes(res, self.as_raw(), axes.as_ptr(), axes.len(), keepdims, s) })
    }

    /// Sum of all elements (0-d result unless `keepdims`).
    pub fn sum_all(&self, keepdims: bool) -> Result<MlxArray> {
        // SAFETY: the handle is live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_sum(res, self.as_raw(), keepdims, s) })
    }

    /// Maximum of all elements (0-d result unless `keepdims`).
    pub fn max_all(&self, keepdims: bool) -> Result<MlxArray> {
        // SAFETY: the handle is live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_max(res, self.as_raw(), keepdims, s) })
    }

    /// Maximum over `axes`.
    pub fn max_axes(&self, axes_: &[i32], keepdims: bool) -> Result<MlxArray> {
        let axes = axes(axes_, self.ndim(), "max")?;
        // SAFETY: `axes` is live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe { sys::mlx_max_axes(res, self.as_raw(), axes.as_ptr(), axes.len(), keepdims, s) })
    }

    /// Converts the elements to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<MlxArray> {
        // SAFETY: the handle is live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_astype(res, self.as_raw(), dtype.to_raw(), s) })
    }

    /// Reinterprets the bytes as `dtype` (the last dimension scales with the size ratio).
    pub fn view(&self, dtype: Dtype) -> Result<MlxArray> {
        // SAFETY: the handle is live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_view(res, self.as_raw(), dtype.to_raw(), s) })
    }

    /// The same elements with a new shape of equal size.
    pub fn reshape(&self, shape: &[usize]) -> Result<MlxArray> {
        let dims = dims(shape)?;
        // SAFETY: `dims` is live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe { sys::mlx_reshape(res, self.as_raw(), dims.as_ptr(), dims.len(), s) })
    }

    /// Permutes the dimensions: output dimension `i` is input dimension `perm[i]`.
    pub fn transpose(&self, perm: &[i32]) -> Result<MlxArray> {
        if perm.len() != self.ndim() {
            invalid!(
                "transpose: permutation {perm:?} has {} axes for an array of {} dimensions",
                perm.len(),
                self.ndim()
            );
        }
        let axes = axes(perm, self.ndim(), "transpose")?;
        // SAFETY: `axes` is live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe { sys::mlx_transpose_axes(res, self.as_raw(), axes.as_ptr(), axes.len(), s) })
    }

    /// Reverses the dimensions (a matrix transpose for 2-D arrays).
    pub fn t(&self) -> Result<MlxArray> {
        // SAFETY: the handle is live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_transpose(res, self.as_raw(), s) })
    }

    /// The elements `start[i] .. stop[i]` with step `strides[i]` along each dimension.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<MlxArray> {
        let n = self.ndim();
        if start.len() != n || stop.len() != n || strides.len() != n {
            invalid!(
                "slice: start {start:?}, stop {stop:?} and strides {strides:?} need one entry per dimension ({n})"
            );
        }
        // SAFETY: the three slices are live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe {
            sys::mlx_slice(
                res,
                self.as_raw(),
                start.as_ptr(),
                start.len(),
                stop.as_ptr(),
                stop.len(),
                strides.as_ptr(),
                strides.len(),
                s,
            )
        })
    }

    /// Gathers the entries `indices` (an integer array) along `axis`.
    pub fn take(&self, indices: &MlxArray, axis: i32) -> Result<MlxArray> {
        let axis = axes(&[axis], self.ndim(), "take")?[0];
        // SAFETY: both handles are live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_take_axis(res, self.as_raw(), indices.as_raw(), axis, s) })
    }

    /// Broadcasts to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<MlxArray> {
        let dims = dims(shape)?;
        // SAFETY: `dims` is live for the call; the handle is live.
        MlxArray::op(|res, s| unsafe { sys::mlx_broadcast_to(res, self.as_raw(), dims.as_ptr(), dims.len(), s) })
    }

    /// Chooses `self` where `condition` is true, else `other` (broadcasting).
    pub fn where_(&self, condition: &MlxArray, other: &MlxArray) -> Result<MlxArray> {
        // SAFETY: all three handles are live for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_where(res, condition.as_raw(), self.as_raw(), other.as_raw(), s) })
    }

    /// True when every element is within `atol + rtol * |other|` of `other` (NaNs unequal).
    pub fn allclose(&self, other: &MlxArray, rtol: f64, atol: f64) -> Result<bool> {
        // SAFETY: both handles are live for the duration of the call.
        let flag = MlxArray::op(|res, s| unsafe {
            sys::mlx_allclose(res, self.as_raw(), other.as_raw(), rtol, atol, false, s)
        })?;
        Ok(flag.to_vec::<bool>()?[0])
    }
}

/// Joins arrays along `axis`.
pub fn concatenate(arrays: &[&MlxArray], axis: i32) -> Result<MlxArray> {
    if arrays.is_empty() {
        invalid!("concatenate needs at least one array");
    }
    let vec = VectorArray::from_arrays(arrays)?;
    // SAFETY: `vec` is a live vector handle for the duration of the call.
    MlxArray::op(|res, s| unsafe { sys::mlx_concatenate_axis(res, vec.raw, axis, s) })
}

/// Evaluates several arrays together (one graph run).
pub fn eval_all(arrays: &[&MlxArray]) -> Result<()> {
    let vec = VectorArray::from_arrays(arrays)?;
    // SAFETY: `vec` is a live vector handle for the duration of the call.
    call(|| unsafe { sys::mlx_eval(vec.raw) })?;
    Ok(())
}

/// Starts evaluating `arrays` and returns without waiting (MLX's `async_eval`): a runner builds
/// the next decoding step's graph while the device computes this one, and then reads this
/// step's result (which waits for it).
pub fn async_eval_all(arrays: &[&MlxArray]) -> Result<()> {
    let vec = VectorArray::from_arrays(arrays)?;
    // SAFETY: `vec` is a live vector handle for the duration of the call.
    call(|| unsafe { sys::mlx_async_eval(vec.raw) })?;
    Ok(())
}

/// An owned `mlx_vector_array` (used to pass lists of arrays to mlx-c and to receive them).
pub(crate) struct VectorArray {
    pub(crate) raw: sys::mlx_vector_array,
}

impl VectorArray {
    pub(crate) fn new() -> VectorArray {
        // SAFETY: creating an empty vector has no preconditions; freed in `Drop`.
        VectorArray { raw: unsafe { sys::mlx_vector_array_new() } }
    }

    pub(crate) fn from_arrays(arrays: &[&MlxArray]) -> Result<VectorArray> {
        let vec = VectorArray::new();
        for a in arrays {
            // SAFETY: both handles are live; the vector takes its own reference.
            call(|| unsafe { sys::mlx_vector_array_append_value(vec.raw, a.as_raw()) })?;
        }
        Ok(vec)
    }

    pub(crate) fn into_arrays(self) -> Result<Vec<MlxArray>> {
        // SAFETY: `self.raw` is a live vector handle.
        let n = unsafe { sys::mlx_vector_array_size(self.raw) };
        (0..n)
            .map(|i| {
                let mut a = MlxArray::empty();
                // SAFETY: `i < n`; the result is a new reference owned by `a`.
                call(|| unsafe { sys::mlx_vector_array_get(a.raw_mut(), self.raw, i) })?;
                Ok(a)
            })
            .collect()
    }
}

impl Drop for VectorArray {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is owned by this value and freed exactly once.
        unsafe { sys::mlx_vector_array_free(self.raw) };
    }
}

fn optional_int(value: i32) -> sys::mlx_optional_int {
    sys::mlx_optional_int { value, has_value: true }
}

/// Random numbers with an explicit seed (reproducible on every backend).
pub mod random {
    use super::*;

    fn key(seed: u64) -> Result<MlxArray> {
        let mut k = MlxArray::empty();
        // SAFETY: `k`'s handle slot is a valid out-pointer.
        call(|| unsafe { sys::mlx_random_key(k.raw_mut(), seed) })?;
        Ok(k)
    }

    /// Samples of N(`mean`, `std`²) of `shape` and floating `dtype`.
    pub fn normal(shape: &[usize], dtype: Dtype, mean: f32, std: f32, seed: u64) -> Result<MlxArray> {
        if !dtype.is_float() {
            invalid!("random normal needs a floating dtype, got {dtype}");
        }
        let dims = dims(shape)?;
        let k = key(seed)?;
        // SAFETY: `dims` is live for the call; `k` is a live key array.
        MlxArray::op(|res, s| unsafe {
            sys::mlx_random_normal(res, dims.as_ptr(), dims.len(), dtype.to_raw(), mean, std, k.as_raw(), s)
        })
    }

    /// Samples of U[`low`, `high`) of `shape` and floating `dtype`.
    pub fn uniform(shape: &[usize], dtype: Dtype, low: f32, high: f32, seed: u64) -> Result<MlxArray> {
        if !dtype.is_float() {
            invalid!("random uniform needs a floating dtype, got {dtype}");
        }
        let dims = dims(shape)?;
        let k = key(seed)?;
        let lo = MlxArray::scalar(low)?;
        let hi = MlxArray::scalar(high)?;
        // SAFETY: `dims` is live for the call; all array handles are live.
        MlxArray::op(|res, s| unsafe {
            sys::mlx_random_uniform(
                res,
                lo.as_raw(),
                hi.as_raw(),
                dims.as_ptr(),
                dims.len(),
                dtype.to_raw(),
                k.as_raw(),
                s,
            )
        })
    }
}

/// MLX's affine quantization of a weight matrix `w` `[out, in]`: `(packed weights, scales,
/// biases)` with `bits` per weight and one scale and bias per `group_size` inputs.
pub fn quantize(w: &MlxArray, group_size: i32, bits: i32) -> Result<(MlxArray, MlxArray, MlxArray)> {
    let mode = CString::new("affine").expect("no NUL");
    let mut out = VectorArray::new();
    let none = MlxArray::empty();
    crate::device::with_current(|s| {
        // SAFETY: `out.raw` is a live vector to fill, `mode` is NUL-terminated and all array
        // handles are live (`none` is the empty handle mlx-c reads as "no global scale").
        call(|| unsafe {
            sys::mlx_quantize(
                &mut out.raw,
                w.as_raw(),
                optional_int(group_size),
                optional_int(bits),
                mode.as_ptr(),
                none.as_raw(),
                s.raw(),
            )
        })?;
        Ok(())
    })?;
    let mut parts = out.into_arrays()?;
    if parts.len() != 3 {
        invalid!("affine quantize returned {} arrays, expected weights, scales and biases", parts.len());
    }
    let biases = parts.pop().expect("3 parts");
    let scales = parts.pop().expect("3 parts");
    let weights = parts.pop().expect("3 parts");
    Ok((weights, scales, biases))
}

/// `x · dequantize(w)ᵀ` (with `transpose`) for MLX's affine-quantized weights.
pub fn quantized_matmul(
    x: &MlxArray,
    w: &MlxArray,
    scales: &MlxArray,
    biases: &MlxArray,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<MlxArray> {
    let mode = CString::new("affine").expect("no NUL");
    // SAFETY: all handles are live and `mode` is NUL-terminated for the duration of the call.
    MlxArray::op(|res, s| unsafe {
        sys::mlx_quantized_matmul(
            res,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            biases.as_raw(),
            transpose,
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            s,
        )
    })
}

/// The dense weights of MLX's affine-quantized `w`.
pub fn dequantize(w: &MlxArray, scales: &MlxArray, biases: &MlxArray, group_size: i32, bits: i32) -> Result<MlxArray> {
    let mode = CString::new("affine").expect("no NUL");
    let none = MlxArray::empty();
    let no_dtype = sys::mlx_optional_dtype { value: Dtype::Float32.to_raw(), has_value: false };
    // SAFETY: all handles are live and `mode` is NUL-terminated for the duration of the call.
    MlxArray::op(|res, s| unsafe {
        sys::mlx_dequantize(
            res,
            w.as_raw(),
            scales.as_raw(),
            biases.as_raw(),
            optional_int(group_size),
            optional_int(bits),
            mode.as_ptr(),
            none.as_raw(),
            no_dtype,
            s,
        )
    })
}
