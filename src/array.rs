//! [`MlxArray`]: an owned handle to one MLX array, and [`SharedArray`], its evaluated form that
//! may cross threads.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;

use mlx_sys as sys;

use crate::device::with_current;
use crate::dtype::{Dtype, Element};
use crate::error::{invalid, Error, Result};
use crate::ffi::{call, call_value};

/// One MLX array: owns one `mlx_array` handle.
///
/// Arrays are lazy: operations build a graph that runs on [`eval`](MlxArray::eval) or when data
/// is read. `Clone` shares the same array (MLX reference counting); [`deep_copy`](MlxArray::deep_copy)
/// makes an independent copy of the data. An `MlxArray` stays on the thread that made it,
/// because MLX can evaluate a lazy array only on its own thread's stream; to hand evaluated data
/// to other threads use [`share`](MlxArray::share):
///
/// ```compile_fail
/// // A lazy array cannot move to another thread (MLX would fail to evaluate it there).
/// let a = mlx_trellis::MlxArray::from_slice(&[1.0f32], &[1]).unwrap();
/// std::thread::spawn(move || a.eval());
/// ```
///
/// ```
/// // Its evaluated, shared form can.
/// let a = mlx_trellis::MlxArray::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// let shared = a.share().unwrap();
/// let v = std::thread::spawn(move || shared.to_vec::<f32>().unwrap()).join().unwrap();
/// assert_eq!(v, [1.0, 2.0]);
/// ```
pub struct MlxArray {
    raw: sys::mlx_array,
    _not_send: PhantomData<*const ()>,
}

/// The most elements an array may have: its bytes (at most 8 per element) must stay addressable.
const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// The element count of `shape`, refused where it overflows or exceeds what can be addressed.
pub(crate) fn element_count(shape: &[usize]) -> Result<usize> {
    match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_ELEMENTS => Ok(n),
        _ => invalid!("shape {shape:?} has more elements than can be addressed (at most {MAX_ELEMENTS})"),
    }
}

/// Converts a host shape to MLX's `int` dimensions, refusing a dimension past MLX's `int` and a
/// shape whose element count overflows (MLX multiplies the dimensions unchecked).
pub(crate) fn dims(shape: &[usize]) -> Result<Vec<c_int>> {
    element_count(shape)?;
    dims_unchecked_memory(shape)
}

/// [`dims`] for an array MLX will allocate, of `dtype`: also refused when its bytes exceed what
/// MLX can get ([`crate::memory::check_fits`]; MLX's CPU allocator would hand back a null
/// buffer).
fn dims_to_allocate(shape: &[usize], dtype: Dtype) -> Result<Vec<c_int>> {
    let bytes = element_count(shape)? as u128 * dtype.size_of() as u128;
    crate::memory::check_fits(bytes, || format!("an array of shape {shape:?} and dtype {dtype}"))?;
    dims(shape)
}

fn dims_unchecked_memory(shape: &[usize]) -> Result<Vec<c_int>> {
    shape
        .iter()
        .map(|&d| {
            c_int::try_from(d)
                .map_err(|_| Error::invalid(format!("dimension {d} in shape {shape:?} exceeds MLX's int range")))
        })
        .collect()
}

impl MlxArray {
    /// Wraps a handle this value now owns.
    pub(crate) fn from_raw(raw: sys::mlx_array) -> MlxArray {
        MlxArray { raw, _not_send: PhantomData }
    }

    /// The underlying handle (still owned by `self`).
    pub fn as_raw(&self) -> sys::mlx_array {
        self.raw
    }

    /// The handle slot, for mlx-c out-parameters.
    pub(crate) fn raw_mut(&mut self) -> &mut sys::mlx_array {
        &mut self.raw
    }

    /// An empty handle, to be filled by an mlx-c call.
    pub(crate) fn empty() -> MlxArray {
        // SAFETY: creating an empty handle has no preconditions; freed in `Drop`.
        MlxArray::from_raw(unsafe { sys::mlx_array_new() })
    }

    /// Runs one mlx-c operation that writes one array on the current stream.
    pub(crate) fn op(f: impl FnOnce(*mut sys::mlx_array, sys::mlx_stream) -> c_int) -> Result<MlxArray> {
        let mut out = MlxArray::empty();
        with_current(|s| {
            call(|| f(&mut out.raw, s.raw()))?;
            Ok(())
        })?;
        Ok(out)
    }

    /// An array with a copy of `data`, laid out row-major with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<MlxArray> {
        let expected = element_count(shape)?;
        if data.len() != expected {
            invalid!("{} elements do not fill shape {shape:?} ({expected} elements)", data.len());
        }
        let dims = dims_to_allocate(shape, T::DTYPE)?;
        // The pointer only has to be valid; MLX copies `expected` elements out of it.
        let ptr = if data.is_empty() { std::ptr::NonNull::<T>::dangling().as_ptr() } else { data.as_ptr() };
        // SAFETY: `ptr` points at `expected` elements of `T`, whose layout is MLX's `T::DTYPE`
        // (bool, integers and IEEE floats; f16/bf16 are their 16-bit patterns); MLX copies them.
        let raw = call_value(|| unsafe {
            sys::mlx_array_new_data(ptr as *const c_void, dims.as_ptr(), dims.len() as c_int, T::DTYPE.to_raw())
        })?;
        Ok(MlxArray::from_raw(raw))
    }

    /// A 0-d array holding `value`.
    pub fn scalar<T: Element>(value: T) -> Result<MlxArray> {
        MlxArray::from_slice(&[value], &[])
    }

    /// Zeros of `shape` and `dtype`.
    pub fn zeros(shape: &[usize], dtype: Dtype) -> Result<MlxArray> {
        let dims = dims_to_allocate(shape, dtype)?;
        // SAFETY: `dims` is a live slice of `dims.len()` ints for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_zeros(res, dims.as_ptr(), dims.len(), dtype.to_raw(), s) })
    }

    /// Ones of `shape` and `dtype`.
    pub fn ones(shape: &[usize], dtype: Dtype) -> Result<MlxArray> {
        let dims = dims_to_allocate(shape, dtype)?;
        // SAFETY: `dims` is a live slice of `dims.len()` ints for the duration of the call.
        MlxArray::op(|res, s| unsafe { sys::mlx_ones(res, dims.as_ptr(), dims.len(), dtype.to_raw(), s) })
    }

    /// `value` (converted to `dtype`) repeated over `shape`.
    pub fn full(shape: &[usize], value: f64, dtype: Dtype) -> Result<MlxArray> {
        let dims = dims_to_allocate(shape, dtype)?;
        // A fill scalar GPUs accept (MLX has no float64 there): f32 for floats, i64 for integers;
        // float64 arrays (CPU only) keep the full value.
        let fill = match dtype {
            Dtype::Bool => MlxArray::scalar(value != 0.0)?,
            Dtype::Float64 => MlxArray::scalar(value)?,
            d if d.is_float() || d == Dtype::Complex64 => MlxArray::scalar(value as f32)?,
            _ => MlxArray::scalar(value as i64)?,
        };
        // SAFETY: `dims` is live for the call and `fill.raw` a live array handle.
        MlxArray::op(|res, s| unsafe { sys::mlx_full(res, dims.as_ptr(), dims.len(), fill.raw, dtype.to_raw(), s) })
    }

    /// `start, start + step, ...` below `stop`, as `dtype`.
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<MlxArray> {
        if step == 0.0 || !step.is_finite() {
            invalid!("arange step must be finite and non-zero, got {step}");
        }
        // SAFETY: scalar arguments only.
        MlxArray::op(|res, s| unsafe { sys::mlx_arange(res, start, stop, step, dtype.to_raw(), s) })
    }

    /// The dimensions. MLX never makes a negative one; if one appears anyway (only a file MLX's
    /// loader misread could do it) it reads as 0 here, never as a huge size: [`try_shape`]
    /// refuses it.
    ///
    /// [`try_shape`]: MlxArray::try_shape
    pub fn shape(&self) -> Vec<usize> {
        self.raw_shape().into_iter().map(|d| usize::try_from(d).unwrap_or(0)).collect()
    }

    /// The dimensions, refusing a negative one.
    pub fn try_shape(&self) -> Result<Vec<usize>> {
        let raw = self.raw_shape();
        raw.iter()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| Error::invalid(format!("MLX array has shape {raw:?}, with a negative dimension")))
            })
            .collect()
    }

    fn raw_shape(&self) -> Vec<c_int> {
        let n = self.ndim();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: `self.raw` is live; MLX returns a pointer to `ndim` ints owned by the array,
        // valid while the array lives, and they are copied out at once.
        let ptr = unsafe { sys::mlx_array_shape(self.raw) };
        // SAFETY: see above; `ptr` is non-null for a live array with ndim > 0.
        unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        // SAFETY: `self.raw` is a live handle.
        unsafe { sys::mlx_array_ndim(self.raw) }
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        // SAFETY: `self.raw` is a live handle.
        unsafe { sys::mlx_array_size(self.raw) }
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        // SAFETY: `self.raw` is a live handle.
        Dtype::from_raw(unsafe { sys::mlx_array_dtype(self.raw) })
    }

    /// Computes the array (and what it depends on) now.
    pub fn eval(&self) -> Result<()> {
        // SAFETY: `self.raw` is a live handle; evaluation happens on this thread.
        call(|| unsafe { sys::mlx_array_eval(self.raw) })?;
        Ok(())
    }

    /// Evaluates and copies the elements out, row-major. `T` must be the array's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            invalid!("cannot read a {} array as {} (convert with astype first)", self.dtype(), T::DTYPE);
        }
        let dense = self.contiguous()?;
        dense.eval()?;
        // SAFETY: `read_evaluated` needs an evaluated, row-contiguous array of dtype `T`: `dense`
        // is all three.
        unsafe { read_evaluated::<T>(dense.raw, dense.size()) }
    }

    /// A row-contiguous array with the same elements (no copy if it already is).
    pub fn contiguous(&self) -> Result<MlxArray> {
        // SAFETY: `self.raw` is a live handle.
        MlxArray::op(|res, s| unsafe { sys::mlx_contiguous(res, self.raw, false, s) })
    }

    /// An independent copy of the data (unlike `clone`, which shares the array). MLX's own
    /// `copy` shares the buffer of an evaluated input, so this copies through a new buffer.
    pub fn deep_copy(&self) -> Result<MlxArray> {
        let dense = self.contiguous()?;
        dense.eval()?;
        let dims = dims(&dense.shape())?;
        if dense.size() == 0 {
            return MlxArray::zeros(&dense.shape(), dense.dtype());
        }
        // SAFETY: `dense` is live and evaluated, so its data pointer is valid.
        let ptr = call_value(|| unsafe { sys::mlx_array_data_uint8(dense.raw) })?;
        // SAFETY: `ptr` holds `dense.size()` row-contiguous elements of `dense.dtype()`, which MLX
        // copies into a new buffer before this returns.
        let raw = call_value(|| unsafe {
            sys::mlx_array_new_data(ptr as *const c_void, dims.as_ptr(), dims.len() as c_int, dense.dtype().to_raw())
        })?;
        Ok(MlxArray::from_raw(raw))
    }

    /// Evaluates the array and returns a handle that other threads may read.
    pub fn share(&self) -> Result<SharedArray> {
        let dense = self.contiguous()?;
        dense.eval()?;
        Ok(SharedArray { inner: dense })
    }

    /// The single element of a one-element array, converted to `f64` on the host (no MLX
    /// operation, so it works on every back-end and for every dtype).
    pub fn item_f64(&self) -> Result<f64> {
        if self.size() != 1 {
            invalid!("item of an array with {} elements (shape {:?})", self.size(), self.shape());
        }
        Ok(match self.dtype() {
            Dtype::Bool => self.to_vec::<bool>()?[0] as u8 as f64,
            Dtype::Uint8 => self.to_vec::<u8>()?[0] as f64,
            Dtype::Uint16 => self.to_vec::<u16>()?[0] as f64,
            Dtype::Uint32 => self.to_vec::<u32>()?[0] as f64,
            Dtype::Uint64 => self.to_vec::<u64>()?[0] as f64,
            Dtype::Int8 => self.to_vec::<i8>()?[0] as f64,
            Dtype::Int16 => self.to_vec::<i16>()?[0] as f64,
            Dtype::Int32 => self.to_vec::<i32>()?[0] as f64,
            Dtype::Int64 => self.to_vec::<i64>()?[0] as f64,
            Dtype::Float16 => self.to_vec::<half::f16>()?[0].to_f64(),
            Dtype::Bfloat16 => self.to_vec::<half::bf16>()?[0].to_f64(),
            Dtype::Float32 => self.to_vec::<f32>()?[0] as f64,
            Dtype::Float64 => self.to_vec::<f64>()?[0],
            Dtype::Complex64 => invalid!("item_f64 of a complex64 array"),
        })
    }
}

impl MlxArray {
    /// Whether no element is NaN or infinite (evaluates the array; integer and boolean arrays
    /// are always finite). For gates on results: one non-finite input value spoils every output
    /// it reaches, and a comparison that skips NaNs would pass it.
    pub fn all_finite(&self) -> Result<bool> {
        if self.size() == 0 {
            return Ok(true);
        }
        // SAFETY: the handle is live for the duration of the call.
        let finite = MlxArray::op(|res, s| unsafe { sys::mlx_isfinite(res, self.raw, s) })?;
        // SAFETY: as above, for `finite`.
        let all = MlxArray::op(|res, s| unsafe { sys::mlx_all(res, finite.raw, false, s) })?;
        // `all` reduces to one element; anything else is MLX failing, never a pass.
        all.to_vec::<bool>()?
            .first()
            .copied()
            .ok_or_else(|| Error::mlx("all_finite: the reduction returned no element"))
    }
}

/// Copies `n` elements out of an evaluated, row-contiguous array of dtype `T`.
///
/// # Safety
/// `raw` must be a live, evaluated, row-contiguous array of `T::DTYPE` with `n` elements.
unsafe fn read_evaluated<T: Element>(raw: sys::mlx_array, n: usize) -> std::result::Result<Vec<T>, Error> {
    // SAFETY: the caller's contract is `borrow_evaluated`'s; the slice is copied out at once.
    Ok(unsafe { borrow_evaluated::<T>(raw, n) }?.to_vec())
}

/// The `n` elements of an evaluated, row-contiguous array of dtype `T`, in place.
///
/// # Safety
/// `raw` must be a live, evaluated, row-contiguous array of `T::DTYPE` with `n` elements, and
/// stay live (and its buffer unchanged) for the slice's lifetime `'a`.
unsafe fn borrow_evaluated<'a, T: Element>(raw: sys::mlx_array, n: usize) -> std::result::Result<&'a [T], Error> {
    if n == 0 {
        return Ok(&[]);
    }
    // Every typed accessor returns the same start pointer (`array::data<T>()` is a cast), and the
    // x86-64 builds have no f16/bf16 accessors, so the byte accessor serves all types.
    // SAFETY: `raw` is live and evaluated (caller's contract), so its data pointer is valid.
    let ptr = call_value(|| unsafe { sys::mlx_array_data_uint8(raw) })?;
    if ptr.is_null() {
        return Err(Error::mlx("array has no data after evaluation"));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::mlx("array data is not aligned for its element type"));
    }
    // SAFETY: the buffer holds `n` contiguous, aligned `T` (caller's contract, alignment checked
    // above) and outlives `'a` (caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, n) })
}

impl Clone for MlxArray {
    /// Shares the same array (MLX reference count); no data is copied.
    fn clone(&self) -> MlxArray {
        let mut copy = MlxArray::empty();
        // SAFETY: both handles are live; `mlx_array_set` shares the source.
        call(|| unsafe { sys::mlx_array_set(&mut copy.raw, self.raw) })
            .expect("mlx_array_set shares a reference and cannot fail on live handles");
        copy
    }
}

impl Drop for MlxArray {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is owned by this value and freed exactly once.
        unsafe { sys::mlx_array_free(self.raw) };
    }
}

impl fmt::Debug for MlxArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MlxArray({:?}, {})", self.shape(), self.dtype())
    }
}

/// An evaluated array that any thread may read. Made by [`MlxArray::share`].
///
/// MLX allows reading an evaluated array's data from any thread and its handle is reference
/// counted atomically, so this type is `Send` and `Sync`; it offers only reads and a conversion
/// back to an [`MlxArray`] on the calling thread (usable as an input to new operations there).
pub struct SharedArray {
    inner: MlxArray,
}

// SAFETY: `inner` is evaluated and row-contiguous when constructed and never exposed mutably or
// lazily; MLX's reads of evaluated data and its `shared_ptr` reference counts are thread-safe.
unsafe impl Send for SharedArray {}
// SAFETY: as above; every method takes `&self` and performs only reads.
unsafe impl Sync for SharedArray {}

impl SharedArray {
    /// The dimensions.
    pub fn shape(&self) -> Vec<usize> {
        self.inner.shape()
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.inner.dtype()
    }

    /// Copies the elements out. `T` must be the array's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            invalid!("cannot read a {} array as {}", self.dtype(), T::DTYPE);
        }
        // SAFETY: `inner` was evaluated and made row-contiguous in `MlxArray::share`.
        unsafe { read_evaluated::<T>(self.inner.raw, self.inner.size()) }
    }

    /// The elements in place, row-major, for as long as this handle lives. `T` must be the
    /// array's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if self.dtype() != T::DTYPE {
            invalid!("cannot read a {} array as {}", self.dtype(), T::DTYPE);
        }
        // SAFETY: `inner` was evaluated and made row-contiguous in `MlxArray::share`, and `self`
        // holds a reference to it, so MLX neither frees nor donates its buffer while the slice
        // (borrowing `self`) lives.
        unsafe { borrow_evaluated::<T>(self.inner.raw, self.inner.size()) }
    }

    /// A handle on the calling thread, usable in new operations.
    pub fn to_array(&self) -> MlxArray {
        self.inner.clone()
    }
}

impl fmt::Debug for SharedArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedArray({:?}, {})", self.shape(), self.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_ptr(a: &MlxArray) -> *const u8 {
        a.eval().unwrap();
        // SAFETY: `a` is live and evaluated, so its data pointer is valid to read (not deref'd).
        call_value(|| unsafe { sys::mlx_array_data_uint8(a.raw) }).unwrap()
    }

    #[test]
    fn a_shared_array_reads_in_place() {
        // A strided view is made contiguous by `share`; its slice is the row-major elements.
        let a = MlxArray::from_slice(&[1u32, 2, 3, 4, 5, 6], &[2, 3]).unwrap().t().unwrap();
        let shared = a.share().unwrap();
        assert_eq!(shared.as_slice::<u32>().unwrap(), &[1, 4, 2, 5, 3, 6]);
        assert_eq!(shared.as_slice::<u32>().unwrap(), shared.to_vec::<u32>().unwrap().as_slice());
        assert!(shared.as_slice::<f32>().is_err());
        let empty = MlxArray::zeros(&[0, 4], Dtype::Float32).unwrap().share().unwrap();
        assert!(empty.as_slice::<f32>().unwrap().is_empty());
    }

    #[test]
    fn clone_shares_and_deep_copy_copies() {
        let a = MlxArray::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let shared = a.clone();
        let copy = a.deep_copy().unwrap();
        assert_eq!(data_ptr(&shared), data_ptr(&a));
        assert_ne!(data_ptr(&copy), data_ptr(&a));
        assert_eq!(copy.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    }
}
