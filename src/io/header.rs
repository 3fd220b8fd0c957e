//! A safetensors file's header, validated before MLX reads the file.
//!
//! MLX's loader takes the header on trust: it reads each tensor's size from its shape (each value
//! cast to a 32-bit int, floats truncated), uses only the start of its `data_offsets`, and keeps
//! one of two duplicate names. So overlapping or out-of-bounds tensors, shapes past 32 bits and
//! duplicates all load, silently wrong. Every rule of the format is therefore checked here, with
//! the `safetensors` crate's own metadata validation as a second opinion: keys unique at every
//! depth, each entry a dtype MLX reads, a shape of integers that fit MLX's `int`, an element
//! count and byte size that do not overflow, offsets whose span is exactly that size, and spans
//! that tile the data section from its first byte to the file's last with no gap or overlap.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use serde_json::value::RawValue;

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::{alloc, array, json};

/// MLX refuses a header of 10^8 bytes or more.
const MAX_HEADER_BYTES: u64 = 100_000_000 - 1;

/// One tensor as the validated header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorEntry {
    /// Its MLX dtype.
    pub(crate) dtype: Dtype,
    /// Its dimensions, each at most `i32::MAX`.
    pub(crate) shape: Vec<usize>,
    /// Its bytes, relative to the start of the data section.
    pub(crate) offsets: (usize, usize),
}

/// A validated header: the tensors by name and the `__metadata__` strings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Header {
    pub(crate) tensors: BTreeMap<String, TensorEntry>,
    pub(crate) metadata: BTreeMap<String, String>,
    /// Where the data section starts in the file (8 + the header's length); tensor offsets count
    /// from here.
    pub(crate) data_start: u64,
}

#[cfg(test)]
thread_local! {
    /// Headers [`read_header`] has read on this thread (for tests that count them).
    pub(crate) static READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Reads and validates the header of the safetensors file `path`.
pub(crate) fn read_header(path: &Path) -> Result<Header> {
    #[cfg(test)]
    READS.with(|n| n.set(n.get() + 1));
    let io = |e| Error::io(path, e);
    let mut file = crate::files::open_regular_file(path)?;
    let file_len = file.metadata().map_err(io)?.len();
    let bad = |message: String| Err(Error::artifact(path, None, message));
    if file_len < 8 {
        return bad(format!("is {file_len} bytes, too short for a safetensors file (8-byte header length first)"));
    }
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(io)?;
    let n = u64::from_le_bytes(prefix);
    if n == 0 || n > MAX_HEADER_BYTES {
        return bad(format!("header length {n} is outside 1..={MAX_HEADER_BYTES}"));
    }
    if n > file_len - 8 {
        return bad(format!("header length {n} runs past the end of the file ({file_len} bytes)"));
    }
    // `n` is below 10^8, so the reservation is bounded.
    let mut text = alloc::try_with_capacity(n as usize, || "its header".into())
        .map_err(|e| Error::artifact(path, None, e.message()))?;
    (&mut file).take(n).read_to_end(&mut text).map_err(io)?;
    if text.len() as u64 != n {
        return bad(format!("header of {n} bytes ends early (the file changed while it was read?)"));
    }
    let mut header = parse_header(&text, file_len - 8 - n).map_err(|p| p.into_error(path))?;
    header.data_start = 8 + n;
    Ok(header)
}

/// The MLX dtype of a safetensors dtype, where MLX 0.32's loader reads it.
fn mlx_dtype(d: safetensors::Dtype) -> Option<Dtype> {
    use safetensors::Dtype as S;
    Some(match d {
        S::BOOL => Dtype::Bool,
        S::U8 => Dtype::Uint8,
        S::I8 => Dtype::Int8,
        S::U16 => Dtype::Uint16,
        S::I16 => Dtype::Int16,
        S::F16 => Dtype::Float16,
        S::BF16 => Dtype::Bfloat16,
        S::U32 => Dtype::Uint32,
        S::I32 => Dtype::Int32,
        S::F32 => Dtype::Float32,
        S::U64 => Dtype::Uint64,
        S::I64 => Dtype::Int64,
        S::C64 => Dtype::Complex64,
        _ => return None,
    })
}

/// Validates header text `text` of a file whose data section holds `data_len` bytes.
fn parse_header(text: &[u8], data_len: u64) -> std::result::Result<Header, json::JsonProblem> {
    let problem = |key: Option<&str>, message: String| json::JsonProblem { key: key.map(str::to_string), message };
    if std::str::from_utf8(text).is_err() {
        return Err(problem(None, "header is not UTF-8".into()));
    }
    let entries: BTreeMap<String, Box<RawValue>> = json::parse(text).map_err(|p| match p.key {
        Some(_) => p,
        None => json::JsonProblem { key: None, message: format!("header {}", p.message) },
    })?;
    let mut header = Header::default();
    let mut infos = Vec::with_capacity(entries.len());
    for (name, raw) in &entries {
        let at = Some(name.as_str());
        if name == "__metadata__" {
            // MLX writes `null` for no metadata.
            let meta: Option<HashMap<String, String>> = serde_json::from_str(raw.get())
                .map_err(|e| problem(at, format!("must map strings to strings: {e}")))?;
            header.metadata = meta.unwrap_or_default().into_iter().collect();
            continue;
        }
        let info: TensorInfo =
            serde_json::from_str(raw.get()).map_err(|e| problem(at, format!("is not a tensor entry: {e}")))?;
        let dtype =
            mlx_dtype(info.dtype).ok_or_else(|| problem(at, format!("dtype {:?} is not one MLX reads", info.dtype)))?;
        if let Some(&d) = info.shape.iter().find(|&&d| d > i32::MAX as usize) {
            return Err(problem(
                at,
                format!("dimension {d} of shape {:?} exceeds MLX's limit {}", info.shape, i32::MAX),
            ));
        }
        // At most `isize::MAX / 8` elements, so the byte size cannot overflow.
        let bytes = array::element_count(&info.shape).map_err(|_| {
            problem(at, format!("shape {:?} of {:?} overflows the address space", info.shape, info.dtype))
        })? * dtype.size_of();
        let (start, end) = info.data_offsets;
        if end < start {
            return Err(problem(at, format!("data_offsets [{start}, {end}] end before they start")));
        }
        if end - start != bytes {
            let message = format!(
                "data_offsets [{start}, {end}] span {} bytes but shape {:?} of {:?} needs {bytes}",
                end - start,
                info.shape,
                info.dtype
            );
            return Err(problem(at, message));
        }
        header.tensors.insert(name.clone(), TensorEntry { dtype, shape: info.shape.clone(), offsets: (start, end) });
        infos.push((name.clone(), info));
    }
    // The spans must tile the data section: sorted by offsets, each starts where the last ended.
    let mut order: Vec<(&String, &TensorEntry)> = header.tensors.iter().collect();
    order.sort_by_key(|(_, e)| e.offsets);
    let mut next = 0usize;
    let mut previous: Option<&str> = None;
    for (name, e) in &order {
        let (start, end) = e.offsets;
        if start != next {
            let what = if start < next { "overlaps" } else { "leaves a gap after" };
            let before = previous.map_or("the start of the data".to_string(), |p| format!("tensor {p:?}"));
            return Err(problem(
                Some(name),
                format!("data_offsets [{start}, {end}] {what} {before} (which ends at {next})"),
            ));
        }
        next = end;
        previous = Some(name);
    }
    if next as u64 != data_len {
        let message = format!("tensors cover {next} bytes of data but the file holds {data_len} after the header");
        return Err(problem(previous, message));
    }
    // The crate's own rules (its sort, its overflow and coverage checks) as a second opinion.
    infos.sort_by_key(|(_, i)| i.data_offsets);
    let meta = (!header.metadata.is_empty()).then(|| header.metadata.clone().into_iter().collect());
    let checked = Metadata::new(meta, infos).map_err(|e| problem(None, format!("header: {e}")))?;
    if checked.data_len() != next {
        return Err(problem(
            None,
            format!("header: the safetensors crate counts {} data bytes, not {next}", checked.data_len()),
        ));
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(header: &str, data_len: u64) -> std::result::Result<Header, String> {
        parse_header(header.as_bytes(), data_len).map_err(|p| format!("{:?}: {}", p.key, p.message))
    }

    #[test]
    fn a_good_header_gives_its_tensors() {
        let h = check(
            r#"{"__metadata__": {"format": "mlx"}, "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]},
                "a": {"dtype": "U32", "shape": [2, 2], "data_offsets": [0, 16]}}"#,
            20,
        )
        .unwrap();
        assert_eq!(h.tensors["a"], TensorEntry { dtype: Dtype::Uint32, shape: vec![2, 2], offsets: (0, 16) });
        assert_eq!(h.tensors["b"].dtype, Dtype::Float16);
        assert_eq!(h.metadata["format"], "mlx");
        assert!(check("{}", 0).unwrap().tensors.is_empty());
        assert!(check(r#"{"__metadata__": null}"#, 0).unwrap().metadata.is_empty());
    }

    #[test]
    fn every_rule_names_the_tensor() {
        let t = |dtype: &str, shape: &str, offsets: &str| {
            format!(r#"{{"x": {{"dtype": "{dtype}", "shape": {shape}, "data_offsets": {offsets}}}}}"#)
        };
        let cases = [
            (t("U32", "[4294967552]", "[0, 4]"), 4, "exceeds MLX's limit"),
            (t("U32", "[1.5]", "[0, 4]"), 4, "is not a tensor entry"),
            (t("U32", "[-1]", "[0, 4]"), 4, "is not a tensor entry"),
            (t("U32", "[2147483647, 2147483647, 2147483647]", "[0, 4]"), 4, "overflows"),
            (t("U32", "[2]", "[0, 4]"), 4, "span 4 bytes but shape [2] of U32 needs 8"),
            (t("U32", "[1]", "[4, 0]"), 4, "end before they start"),
            (t("F8_E4M3", "[1]", "[0, 1]"), 1, "is not one MLX reads"),
            (t("X", "[1]", "[0, 1]"), 1, "is not a tensor entry"),
            (t("U32", "[1]", "[4, 8]"), 8, "leaves a gap after the start of the data"),
            (t("U32", "[1]", "[0, 4]"), 8, "cover 4 bytes of data but the file holds 8"),
        ];
        for (header, len, want) in cases {
            let e = check(&header, len).unwrap_err();
            assert!(e.starts_with("Some(\"x\")") && e.contains(want), "{header}: {e}");
        }
        let overlap = r#"{"a": {"dtype": "U32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "U32", "shape": [1], "data_offsets": [4, 8]}}"#;
        let e = check(overlap, 8).unwrap_err();
        assert!(e.contains("\"b\"") && e.contains("overlaps tensor \"a\""), "{e}");
        let dup = r#"{"a": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]},
                      "a": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]}}"#;
        assert!(check(dup, 4).unwrap_err().starts_with("Some(\"a\"): duplicate key"));
        assert!(check(r#"{"__metadata__": {"n": 1}}"#, 0).unwrap_err().contains("strings to strings"));
        assert!(check("[1]", 0).unwrap_err().contains("header is not valid JSON"));
    }
}
