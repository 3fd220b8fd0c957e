//! Safetensors files through mlx-c (`mlx_load_safetensors` / `mlx_save_safetensors`), each
//! header validated first ([`header`]) since MLX's loader trusts it.

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::path::Path;

use crate::error::ErrorContext;
use mlx_sys as sys;

use crate::array::MlxArray;
use crate::device::Stream;
use crate::error::{Error, Result};
use crate::ffi::call;

pub(crate) mod gguf;
mod gguf_header;
mod header;

#[cfg(test)]
pub(crate) use header::READS;
pub(crate) use header::{read_header, Header, TensorEntry};

/// The tensors and the metadata of one safetensors file.
#[derive(Debug, Default)]
pub struct Safetensors {
    /// Tensors by name.
    pub tensors: BTreeMap<String, MlxArray>,
    /// The file's `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
}

struct ArrayMap(sys::mlx_map_string_to_array);
struct StringMap(sys::mlx_map_string_to_string);

impl Drop for ArrayMap {
    fn drop(&mut self) {
        // SAFETY: the map is owned by this value and freed exactly once.
        unsafe { sys::mlx_map_string_to_array_free(self.0) };
    }
}

impl Drop for StringMap {
    fn drop(&mut self) {
        // SAFETY: the map is owned by this value and freed exactly once.
        unsafe { sys::mlx_map_string_to_string_free(self.0) };
    }
}

fn path_cstring(path: &Path) -> Result<CString> {
    let text = path.to_str().ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", path.display())))?;
    CString::new(text).map_err(|_| Error::invalid(format!("path {text:?} contains a NUL byte")))
}

fn key_cstring(key: &str) -> Result<CString> {
    CString::new(key).map_err(|_| Error::invalid(format!("name {key:?} contains a NUL byte")))
}

/// Reads every tensor and the metadata of a safetensors file. The header is validated before MLX
/// sees the file (every rule of the format is checked: a malformed header is an
/// [`Error::Artifact`] naming the file and the tensor), and the tensors are evaluated (read from disk) before this returns.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<Safetensors> {
    let path = path.as_ref();
    load_inner(path, true).map_err(|e| loading(e, path))
}

/// The tensors of a safetensors file whose header [`read_header`] returned as `header`, not yet
/// read from disk (MLX reads each when it is evaluated): for taking a few tensors out of a large
/// file whose header a caller keeps.
pub(crate) fn load_safetensors_lazy(path: &Path, header: &Header) -> Result<BTreeMap<String, MlxArray>> {
    let loaded = load_validated(path, header, false).map_err(|e| loading(e, path))?;
    Ok(loaded.tensors)
}

/// `e` with what was being done, naming `path` only where `e` does not already: file errors
/// about it do, and so does the one argument loading refuses, a path MLX cannot take
/// ([`path_cstring`]); MLX's own failures do not.
fn loading(e: Error, path: &Path) -> Error {
    let names_path = match e.root() {
        Error::Io { path: p, .. } | Error::Artifact { file: p, .. } => p == path,
        Error::InvalidArgument { .. } => true,
        _ => false,
    };
    if names_path {
        e.context("loading a safetensors file")
    } else {
        e.context(format!("loading safetensors file {}", path.display()))
    }
}

fn load_inner(path: &Path, eval: bool) -> Result<Safetensors> {
    load_validated(path, &read_header(path)?, eval)
}

/// Loads `path` through MLX, checking what MLX read against `header`, the file's validated
/// header.
fn load_validated(path: &Path, header: &Header, eval: bool) -> Result<Safetensors> {
    let file = path_cstring(path)?;
    // SAFETY: creating empty maps has no preconditions; they are freed by the guards.
    let mut arrays = ArrayMap(unsafe { sys::mlx_map_string_to_array_new() });
    // SAFETY: as above.
    let mut strings = StringMap(unsafe { sys::mlx_map_string_to_string_new() });
    // Loading reads from disk: MLX requires a CPU stream for it.
    let cpu = Stream::cpu()?;
    // SAFETY: both maps are live slots to fill, `file` is NUL-terminated, `cpu` is live.
    call(|| unsafe { sys::mlx_load_safetensors(&mut arrays.0, &mut strings.0, file.as_ptr(), cpu.raw()) })
        .map_err(|e| Error::artifact(path, None, format!("MLX could not read it: {}", e.message())))?;

    // The strings MLX read are the validated header's (it refused duplicates and non-strings).
    let mut out = Safetensors { tensors: BTreeMap::new(), metadata: header.metadata.clone() };
    // SAFETY: `arrays.0` is a live map; the iterator is freed below before the map.
    let it = unsafe { sys::mlx_map_string_to_array_iterator_new(arrays.0) };
    let result = (|| -> Result<()> {
        loop {
            let mut key: *const c_char = std::ptr::null();
            let mut value = MlxArray::empty();
            // mlx-c returns 2 at the end of the map, 1 on failure.
            crate::ffi::ensure_handler();
            // SAFETY: `key` and the value slot are valid out-pointers; `it` is live.
            let status = unsafe { sys::mlx_map_string_to_array_iterator_next(&mut key, value.raw_mut(), it) };
            match status {
                0 => {}
                2 => return Ok(()),
                _ => return Err(Error::mlx("iterating the loaded tensors failed")),
            }
            // SAFETY: `key` points at the map's NUL-terminated key, alive while the map lives.
            let name = unsafe { CStr::from_ptr(key) }.to_string_lossy().into_owned();
            // What MLX made of the header must be what was validated.
            let agrees = header
                .tensors
                .get(&name)
                .is_some_and(|t| value.try_shape().is_ok_and(|s| s == t.shape) && value.dtype() == t.dtype);
            if !agrees {
                let message = format!(
                    "MLX read it as {} {:?}, which the validated header does not describe",
                    value.dtype(),
                    value.shape()
                );
                return Err(Error::artifact(path, Some(&name), message));
            }
            if eval {
                value
                    .eval()
                    .map_err(|e| Error::artifact(path, Some(&name), format!("reading it failed: {}", e.message())))?;
            }
            out.tensors.insert(name, value);
        }
    })();
    // SAFETY: `it` is live and freed exactly once.
    unsafe { sys::mlx_map_string_to_array_iterator_free(it) };
    result?;
    if out.tensors.len() != header.tensors.len() {
        let missing = header.tensors.keys().find(|k| !out.tensors.contains_key(*k));
        return Err(Error::artifact(path, missing.map(String::as_str), "MLX did not read this tensor"));
    }

    Ok(out)
}

/// Writes `tensors` (evaluated first) and `metadata` to the safetensors file `path`, exactly
/// that path whatever its extension. The file is written under a temporary name in the same
/// directory and renamed over `path` once complete, so a reader sees the old file or the new
/// one, never a part; a failed write leaves `path` as it was and removes the temporary file.
pub fn save_safetensors<'a>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (&'a str, &'a MlxArray)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let path = path.as_ref();
    (|| -> Result<()> {
        if path.as_os_str().is_empty() {
            return Err(Error::invalid("empty path: name the file to write"));
        }
        if path.is_dir() {
            return Err(Error::invalid("it is a directory"));
        }
        // MLX appends ".safetensors" to a name without it: the temporary name ends in it.
        let temporary = temporary_sibling(path)?;
        let file = path_cstring(&temporary)?;
        // SAFETY: creating empty maps has no preconditions; they are freed by the guards.
        let arrays = ArrayMap(unsafe { sys::mlx_map_string_to_array_new() });
        // SAFETY: as above.
        let strings = StringMap(unsafe { sys::mlx_map_string_to_string_new() });
        for (name, array) in tensors {
            array.eval().with_context(|| format!("evaluating tensor {name:?}"))?;
            let key = key_cstring(name)?;
            // SAFETY: the map and array are live; `key` is NUL-terminated; the map copies both.
            call(|| unsafe { sys::mlx_map_string_to_array_insert(arrays.0, key.as_ptr(), array.as_raw()) })?;
        }
        for (k, v) in metadata {
            let (k, v) = (key_cstring(k)?, key_cstring(v)?);
            // SAFETY: the map is live and both strings are NUL-terminated; the map copies them.
            call(|| unsafe { sys::mlx_map_string_to_string_insert(strings.0, k.as_ptr(), v.as_ptr()) })?;
        }
        // SAFETY: `file` is NUL-terminated and both maps are live.
        let saved = call(|| unsafe { sys::mlx_save_safetensors(file.as_ptr(), arrays.0, strings.0) });
        let renamed = saved.and_then(|()| std::fs::rename(&temporary, path).map_err(|e| Error::io(path, e)));
        if renamed.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        renamed
    })()
    .with_context(|| format!("saving safetensors file {}", path.display()))
}

/// A name for a temporary file next to `path` (same directory, so a rename replaces `path` in
/// one step), unique to this process and call, ending in `.safetensors`.
fn temporary_sibling(path: &Path) -> Result<std::path::PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let Some(name) = path.file_name() else {
        return Err(Error::invalid("the path names no file"));
    };
    let unique = format!(
        ".{}.{}-{}.tmp.safetensors",
        name.to_string_lossy(),
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    );
    Ok(path.with_file_name(unique))
}
