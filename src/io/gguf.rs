//! GGUF files through mlx-c (`mlx_load_gguf` and the `mlx_io_gguf` metadata getters), each file's
//! structure validated first ([`super::gguf_header`]) since MLX's reader trusts it.
//!
//! MLX returns plain tensors (F32, F16, integers) as they are and the quantized ones (Q4_0, Q4_1,
//! Q4_K, Q8_0) as its own affine triplets: `NAME.weight` (packed `uint32`), `PREFIX.scales` and
//! `PREFIX.biases` (`float16`, one per 32 weights along the innermost dimension), where `PREFIX`
//! is the name without `.weight`. [`Gguf::tensor`] hands out either form as a [`GgufTensor`].

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use mlx_sys as sys;

pub use super::gguf_header::GgmlType;
use super::gguf_header::{read_gguf_header, GgufHeader, MetadataKind, TensorInfo};
use crate::array::MlxArray;
use crate::device::Stream;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::{call, call_value};
use crate::ops::dequantize;

/// MLX's group size for every quantized GGUF type.
pub const GGUF_GROUP_SIZE: i32 = 32;

/// One tensor of a GGUF file as MLX reads it.
#[derive(Debug, Clone)]
pub enum GgufTensor {
    /// A plain tensor (F32, F16 or an integer type), in MLX's row-major order (`[out, in]` for a
    /// weight matrix).
    Dense(MlxArray),
    /// A quantized tensor as MLX affine weights: `dequantize(weight, scales, biases, group_size,
    /// bits)` is the tensor, `[out, in]` for a weight matrix.
    Affine {
        /// The packed weights (`uint32`, `[.., in · bits / 32]`).
        weight: MlxArray,
        /// One scale per group (`float16`, `[.., in / group_size]`).
        scales: MlxArray,
        /// One bias per group (`float16`, `[.., in / group_size]`).
        biases: MlxArray,
        /// Weights per group (32 for every GGUF type).
        group_size: i32,
        /// Bits per weight (4 or 8).
        bits: i32,
    },
}

/// An opened, validated GGUF file: its tensors and metadata as MLX read them.
///
/// ```no_run
/// # fn main() -> mlx_trellis::Result<()> {
/// let gguf = mlx_trellis::Gguf::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
/// let layers = gguf.metadata_u64("llama.block_count")?;
/// let w = gguf.dense_f32("blk.0.ffn_down.weight")?; // [576, 1536], f32
/// # Ok(())
/// # }
/// ```
pub struct Gguf {
    raw: sys::mlx_io_gguf,
    path: PathBuf,
    header: GgufHeader,
}

impl Drop for Gguf {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this value and freed exactly once.
        unsafe { sys::mlx_io_gguf_free(self.raw) };
    }
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .field("metadata", &self.header.metadata.len())
            .finish()
    }
}

struct VectorString(sys::mlx_vector_string);

impl Drop for VectorString {
    fn drop(&mut self) {
        // SAFETY: the vector is owned by this value and freed exactly once.
        unsafe { sys::mlx_vector_string_free(self.0) };
    }
}

struct MlxString(sys::mlx_string);

impl Drop for MlxString {
    fn drop(&mut self) {
        // SAFETY: the string is owned by this value and freed exactly once.
        unsafe { sys::mlx_string_free(self.0) };
    }
}

/// mlx-c's getters answer 2 for a missing key and 3 for a key of another type, without a message.
const NOT_FOUND: i32 = 2;
const WRONG_TYPE: i32 = 3;

impl Gguf {
    /// Validates the file's structure, then reads it with MLX (every tensor is read into memory).
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let header = read_gguf_header(path)?;
        let text = path.to_str().ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", path.display())))?;
        let file = CString::new(text).map_err(|_| Error::invalid(format!("path {text:?} contains a NUL byte")))?;
        // SAFETY: creating an empty GGUF object has no preconditions; freed by `Gguf`'s Drop.
        let mut gguf = Gguf { raw: unsafe { sys::mlx_io_gguf_new() }, path: path.to_path_buf(), header };
        // Loading reads from disk: MLX requires a CPU stream for it.
        let cpu = Stream::cpu()?;
        // SAFETY: `gguf.raw` is a live slot to fill, `file` is NUL-terminated, `cpu` is live.
        call(|| unsafe { sys::mlx_load_gguf(&mut gguf.raw, file.as_ptr(), cpu.raw()) })
            .map_err(|e| Error::artifact(path, None, format!("MLX could not read it: {}", e.message())))?;
        Ok(gguf)
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The tensors' names as the file lists them (quantized ones under their `.weight` name).
    pub fn tensor_names(&self) -> Vec<String> {
        self.header.tensors.keys().cloned().collect()
    }

    /// The metadata keys.
    pub fn metadata_keys(&self) -> Vec<String> {
        self.header.metadata.keys().cloned().collect()
    }

    /// Whether the file has metadata key `key`.
    pub fn has_metadata(&self, key: &str) -> bool {
        self.header.metadata.contains_key(key)
    }

    /// The GGML type of tensor `name`.
    pub fn tensor_type(&self, name: &str) -> Result<GgmlType> {
        Ok(self.info(name)?.ggml_type)
    }

    /// The logical shape of tensor `name` in MLX's order (`[out, in]` for a weight matrix).
    pub fn tensor_shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.info(name)?.shape.clone())
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensors.get(name).ok_or_else(|| self.missing(name, "tensor"))
    }

    fn missing(&self, key: &str, what: &str) -> Error {
        Error::artifact(&self.path, Some(key), format!("no such {what} in the file"))
    }

    /// One array MLX holds under `key` (a tensor or a quantized tensor's derived part).
    fn mlx_array(&self, key: &str) -> Result<MlxArray> {
        let c_key = CString::new(key).map_err(|_| Error::invalid(format!("name {key:?} contains a NUL byte")))?;
        let mut out = MlxArray::empty();
        // SAFETY: `out`'s slot is a valid out-pointer, the GGUF object is live, `c_key` is
        // NUL-terminated.
        let status = call_value(|| unsafe { sys::mlx_io_gguf_get_array(out.raw_mut(), self.raw, c_key.as_ptr()) })?;
        match status {
            0 => Ok(out),
            NOT_FOUND => Err(Error::artifact(&self.path, Some(key), "MLX did not read this tensor")),
            s => {
                Err(Error::artifact(&self.path, Some(key), format!("MLX failed to hand this tensor out (status {s})")))
            }
        }
    }

    /// Tensor `name` (a name [`tensor_names`](Gguf::tensor_names) lists) as MLX read it, checked
    /// against the validated file: plain tensors with their shape, quantized ones as an affine
    /// triplet whose parts have the shapes the logical shape implies.
    pub fn tensor(&self, name: &str) -> Result<GgufTensor> {
        let info = self.info(name)?;
        let bad = |message: String| Err(Error::artifact(&self.path, Some(name), message));
        let Some(bits) = info.ggml_type.quantized_bits() else {
            let array = self.mlx_array(name)?;
            if array.try_shape()? != info.shape {
                return bad(format!("MLX read it as {:?}, the file says {:?}", array.shape(), info.shape));
            }
            return Ok(GgufTensor::Dense(array));
        };
        // The validator made sure quantized names end in ".weight".
        let prefix = name.strip_suffix(".weight").unwrap_or(name);
        let weight = self.mlx_array(name)?;
        let scales = self.mlx_array(&format!("{prefix}.scales"))?;
        let biases = self.mlx_array(&format!("{prefix}.biases"))?;
        let (lead, inner) = info.shape.split_at(info.shape.len() - 1);
        let inner = inner[0];
        let packed: Vec<usize> = lead.iter().copied().chain([inner * bits as usize / 32]).collect();
        let groups: Vec<usize> = lead.iter().copied().chain([inner / GGUF_GROUP_SIZE as usize]).collect();
        let parts_agree = weight.try_shape()? == packed
            && weight.dtype() == Dtype::Uint32
            && [&scales, &biases]
                .iter()
                .all(|a| a.try_shape().is_ok_and(|s| s == groups) && a.dtype() == Dtype::Float16);
        if !parts_agree {
            return bad(format!(
                "MLX read it as weight {} {:?}, scales {} {:?}, biases {} {:?}; a {} tensor of shape {:?} needs \
                 uint32 {packed:?} and float16 {groups:?}",
                weight.dtype(),
                weight.shape(),
                scales.dtype(),
                scales.shape(),
                biases.dtype(),
                biases.shape(),
                info.ggml_type.name(),
                info.shape
            ));
        }
        Ok(GgufTensor::Affine { weight, scales, biases, group_size: GGUF_GROUP_SIZE, bits })
    }

    /// Tensor `name` in float32 (dequantized where it is quantized), in its logical shape
    /// (`[out, in]` for a weight matrix). Non-finite values are refused.
    pub fn dense_f32(&self, name: &str) -> Result<MlxArray> {
        let dense = match self.tensor(name)? {
            GgufTensor::Dense(a) => a.astype(Dtype::Float32)?,
            // Scales and biases in f32, so each weight is `scale · q + bias` rounded once to f32
            // rather than computed in float16.
            GgufTensor::Affine { weight, scales, biases, group_size, bits } => {
                dequantize(&weight, &scales.astype(Dtype::Float32)?, &biases.astype(Dtype::Float32)?, group_size, bits)?
            }
        };
        if !dense.all_finite()? {
            return Err(Error::artifact(&self.path, Some(name), "holds non-finite values"));
        }
        Ok(dense)
    }

    fn kind(&self, key: &str) -> Result<&MetadataKind> {
        let kind = self.header.metadata.get(key).ok_or_else(|| self.missing(key, "metadata key"))?;
        if self.header.keys_with_nul.contains(key) {
            let message = "holds a NUL byte, which MLX's C interface would cut the text at";
            return Err(Error::artifact(&self.path, Some(key), message));
        }
        Ok(kind)
    }

    fn wrong_kind(&self, key: &str, kind: &MetadataKind, want: &str) -> Error {
        Error::artifact(&self.path, Some(key), format!("is {}, not {want}", kind.describe()))
    }

    /// Runs one metadata getter and maps mlx-c's status codes to errors naming the file and key.
    fn get_metadata(&self, key: &str, want: &str, f: impl FnOnce(*const c_char) -> i32) -> Result<()> {
        let c_key = CString::new(key).map_err(|_| Error::invalid(format!("key {key:?} contains a NUL byte")))?;
        match call_value(|| f(c_key.as_ptr()))? {
            0 => Ok(()),
            NOT_FOUND => Err(Error::artifact(&self.path, Some(key), "MLX did not read this metadata key")),
            WRONG_TYPE => Err(Error::artifact(&self.path, Some(key), format!("MLX did not read it as {want}"))),
            s => Err(Error::artifact(&self.path, Some(key), format!("MLX failed to hand it out (status {s})"))),
        }
    }

    /// The string metadata value `key`.
    pub fn metadata_string(&self, key: &str) -> Result<String> {
        let kind = self.kind(key)?;
        let MetadataKind::String { bytes } = *kind else {
            return Err(self.wrong_kind(key, kind, "a string"));
        };
        // SAFETY: creating an empty string has no preconditions; freed by the guard.
        let mut s = MlxString(unsafe { sys::mlx_string_new() });
        // SAFETY: `s.0` is a live slot to fill; the GGUF object and the key are live.
        self.get_metadata(key, "a string", |k| unsafe { sys::mlx_io_gguf_get_metadata_string(&mut s.0, self.raw, k) })?;
        // SAFETY: `s.0` is live; mlx-c returns its NUL-terminated data (or null on failure).
        let ptr = call_value(|| unsafe { sys::mlx_string_data(s.0) })?;
        let text = c_text(ptr, bytes).ok_or_else(|| self.nul_inside(key))?;
        Ok(text)
    }

    /// The string-array metadata value `key`.
    pub fn metadata_strings(&self, key: &str) -> Result<Vec<String>> {
        let kind = self.kind(key)?;
        let MetadataKind::StringArray { len } = *kind else {
            return Err(self.wrong_kind(key, kind, "an array of strings"));
        };
        // SAFETY: creating an empty vector has no preconditions; freed by the guard.
        let mut v = VectorString(unsafe { sys::mlx_vector_string_new() });
        // SAFETY: `v.0` is a live slot to fill; the GGUF object and the key are live.
        self.get_metadata(key, "an array of strings", |k| unsafe {
            sys::mlx_io_gguf_get_metadata_vector_string(&mut v.0, self.raw, k)
        })?;
        // SAFETY: `v.0` is a live vector.
        let n = unsafe { sys::mlx_vector_string_size(v.0) };
        if n != len {
            let message = format!("MLX read {n} strings, the file holds {len}");
            return Err(Error::artifact(&self.path, Some(key), message));
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut ptr: *mut c_char = std::ptr::null_mut();
            // SAFETY: `i < n`; mlx-c points `ptr` at the vector's own NUL-terminated string.
            call(|| unsafe { sys::mlx_vector_string_get(&mut ptr, v.0, i) })?;
            // The validator flagged keys with a NUL byte in any string ([`Gguf::kind`]).
            let text = c_text(ptr, usize::MAX).ok_or_else(|| self.nul_inside(key))?;
            out.push(text);
        }
        Ok(out)
    }

    /// The numeric metadata value `key` as MLX reads it: a 0-d array for one number, a 1-D array
    /// for an array of numbers (float64 values come back as float32, as MLX reads them).
    pub fn metadata_array(&self, key: &str) -> Result<MlxArray> {
        let kind = self.kind(key)?;
        if !matches!(kind, MetadataKind::Number(_) | MetadataKind::NumberArray { .. }) {
            return Err(self.wrong_kind(key, kind, "a number or an array of numbers"));
        }
        let mut out = MlxArray::empty();
        // SAFETY: `out`'s slot is a valid out-pointer; the GGUF object and the key are live.
        self.get_metadata(key, "numbers", |k| unsafe {
            sys::mlx_io_gguf_get_metadata_array(out.raw_mut(), self.raw, k)
        })?;
        Ok(out)
    }

    /// The one-number metadata value `key` as f64.
    pub fn metadata_f64(&self, key: &str) -> Result<f64> {
        let kind = self.kind(key)?;
        if !matches!(kind, MetadataKind::Number(_)) {
            return Err(self.wrong_kind(key, kind, "one number"));
        }
        // MLX's GPU back-ends have no float64: convert this one number on the CPU stream.
        let _cpu = crate::device::Stream::cpu()?.enter();
        let value = self.metadata_array(key)?.astype(Dtype::Float64)?.to_vec::<f64>()?;
        match value.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::artifact(&self.path, Some(key), format!("MLX read {} values for one number", value.len()))),
        }
    }

    /// The one-number metadata value `key` as a non-negative integer (refused where it is
    /// negative or not a whole number).
    pub fn metadata_u64(&self, key: &str) -> Result<u64> {
        let kind = self.kind(key)?;
        if !matches!(kind, MetadataKind::Number(t) if t.starts_with("uint") || t.starts_with("int")) {
            return Err(self.wrong_kind(key, kind, "an integer"));
        }
        let value = self.metadata_array(key)?.astype(Dtype::Int64)?.to_vec::<i64>()?;
        match value.as_slice() {
            [v] => u64::try_from(*v).map_err(|_| Error::artifact(&self.path, Some(key), format!("is {v}, negative"))),
            _ => Err(Error::artifact(&self.path, Some(key), format!("MLX read {} values for one number", value.len()))),
        }
    }

    fn nul_inside(&self, key: &str) -> Error {
        Error::artifact(&self.path, Some(key), "holds a NUL byte or text that is not UTF-8")
    }
}

/// The UTF-8 text at `ptr`, refused (None) where it is null, not `expected` bytes long (when
/// given) or not UTF-8.
fn c_text(ptr: *const c_char, expected: usize) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a NUL-terminated string owned by a live mlx-c object.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if expected != usize::MAX && bytes.len() != expected {
        return None;
    }
    std::str::from_utf8(bytes).ok().map(str::to_string)
}
