//! A GGUF file's structure, walked and validated before MLX reads the file.
//!
//! MLX reads GGUF through gguflib, which maps the file and takes every length and offset in it on
//! trust: a string or array length past the end, a tensor whose data runs out of the file, a
//! dimension past 32 bits or a name MLX derives a second tensor from would read out of bounds or
//! load silently wrong. So the whole metadata and tensor-information sections are read here first:
//! magic and version, bounded counts, every key once (with its value type and length), every
//! tensor's name, dimensions, type and data span, inside the file and aligned as the file says.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// The file's first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
/// At most this many metadata entries and tensors (real models have a few hundred of each).
const MAX_ENTRIES: u64 = 1 << 20;
/// Longest string (key, tensor name or value) accepted: chat templates are a few KiB.
const MAX_STRING_BYTES: u64 = 1 << 24;
/// MLX reads array lengths and tensor element counts as `int`.
const MAX_MLX_INT: u64 = i32::MAX as u64;
/// GGML tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// The data alignment when the file does not set `general.alignment`.
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value type (GGUF's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueType {
    /// Numbers and booleans: MLX reads them as arrays.
    Number {
        /// GGUF's type name.
        name: &'static str,
        /// Bytes per value.
        bytes: u64,
    },
    /// A UTF-8 string.
    String,
}

impl ValueType {
    fn from_code(code: u32) -> Option<ValueType> {
        let number = |name, bytes| Some(ValueType::Number { name, bytes });
        match code {
            0 => number("uint8", 1),
            1 => number("int8", 1),
            2 => number("uint16", 2),
            3 => number("int16", 2),
            4 => number("uint32", 4),
            5 => number("int32", 4),
            6 => number("float32", 4),
            7 => number("bool", 1),
            8 => Some(ValueType::String),
            10 => number("uint64", 8),
            11 => number("int64", 8),
            12 => number("float64", 8),
            _ => None,
        }
    }
}

/// What one metadata key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MetadataKind {
    /// One number (MLX: a 0-d array).
    Number(&'static str),
    /// One string of `bytes` bytes.
    String {
        /// Its length in bytes.
        bytes: usize,
    },
    /// An array of `len` numbers (MLX: a 1-D array).
    NumberArray {
        /// GGUF's element type name.
        element: &'static str,
        /// Its length.
        len: usize,
    },
    /// An array of `len` strings (MLX: a vector of strings).
    StringArray {
        /// Its length.
        len: usize,
    },
}

impl MetadataKind {
    /// How the kind reads in a message.
    pub(crate) fn describe(&self) -> String {
        match self {
            MetadataKind::Number(t) => format!("a {t} number"),
            MetadataKind::String { .. } => "a string".into(),
            MetadataKind::NumberArray { element, len } => format!("an array of {len} {element} values"),
            MetadataKind::StringArray { len } => format!("an array of {len} strings"),
        }
    }
}

/// A GGML tensor type MLX's reader serves: plain types are copied, the quantized ones become
/// MLX affine triplets (weight, scales, biases) in groups of 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 4-bit, one f16 scale per 32 weights (bias −8 · scale).
    Q4_0,
    /// 4-bit, one f16 scale and one f16 minimum per 32 weights.
    Q4_1,
    /// 4-bit super-blocks of 256 with 6-bit scales and minimums per 32 weights.
    Q4K,
    /// 8-bit, one f16 scale per 32 weights (bias −128 · scale).
    Q8_0,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
}

impl GgmlType {
    fn from_code(code: u32) -> Option<GgmlType> {
        Some(match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            24 => GgmlType::I8,
            25 => GgmlType::I16,
            26 => GgmlType::I32,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block) along the innermost dimension.
    fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 | GgmlType::I32 => (1, 4),
            GgmlType::F16 | GgmlType::I16 => (1, 2),
            GgmlType::I8 => (1, 1),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (256, 144),
        }
    }

    /// The affine bits MLX gives this type, or `None` for a plain type.
    pub fn quantized_bits(self) -> Option<i32> {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K => Some(4),
            GgmlType::Q8_0 => Some(8),
            _ => None,
        }
    }

    /// GGML's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::I8 => "I8",
            GgmlType::I16 => "I16",
            GgmlType::I32 => "I32",
        }
    }
}

/// One tensor as the validated file describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorInfo {
    /// Its type.
    pub(crate) ggml_type: GgmlType,
    /// Its dimensions in MLX's (row-major) order: GGUF lists them innermost first.
    pub(crate) shape: Vec<usize>,
    /// Where its data starts in the file.
    pub(crate) file_offset: u64,
    /// Its data's length in bytes.
    pub(crate) bytes: u64,
}

/// A validated GGUF file: its version, metadata kinds and tensors.
#[derive(Debug, Clone)]
pub(crate) struct GgufHeader {
    /// The format version (2 or 3).
    pub(crate) version: u32,
    /// Each metadata key's kind.
    pub(crate) metadata: BTreeMap<String, MetadataKind>,
    /// Each tensor by name.
    pub(crate) tensors: BTreeMap<String, TensorInfo>,
    /// Keys whose string (or one of whose strings) holds a NUL byte, which mlx-c's C strings
    /// would cut short: their getters refuse them.
    pub(crate) keys_with_nul: BTreeSet<String>,
}

/// A reader that knows its position and the file's length, so every length read from the file
/// is checked against what is left before anything is read or allocated.
struct Cursor<'a> {
    reader: BufReader<File>,
    pos: u64,
    len: u64,
    path: &'a Path,
}

impl Cursor<'_> {
    fn bad(&self, key: Option<&str>, message: impl Into<String>) -> Error {
        Error::artifact(self.path, key, message)
    }

    fn need(&self, n: u64, what: &str) -> Result<()> {
        if n > self.len - self.pos {
            let message =
                format!("{what} ({n} bytes at offset {}) runs past the end of the file ({} bytes)", self.pos, self.len);
            return Err(self.bad(None, message));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.reader.read_exact(&mut b).map_err(|e| Error::io(self.path, e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<()> {
        self.need(n, what)?;
        let step = i64::try_from(n).map_err(|_| self.bad(None, format!("{what}: {n} bytes is too long")))?;
        self.reader.seek_relative(step).map_err(|e| Error::io(self.path, e))?;
        self.pos += n;
        Ok(())
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING_BYTES {
            return Err(self.bad(None, format!("{what} is {n} bytes long, more than the {MAX_STRING_BYTES} accepted")));
        }
        self.need(n, what)?;
        let mut buf = vec![0u8; n as usize];
        self.reader.read_exact(&mut buf).map_err(|e| Error::io(self.path, e))?;
        self.pos += n;
        String::from_utf8(buf).map_err(|_| self.bad(None, format!("{what} at offset {} is not UTF-8", self.pos - n)))
    }

    /// A metadata string value: its length, and whether it holds a NUL byte.
    fn value_string(&mut self, what: &str) -> Result<(usize, bool)> {
        let s = self.string(what)?;
        Ok((s.len(), s.contains('\0')))
    }
}

/// Reads and validates the structure of the GGUF file `path`.
pub(crate) fn read_gguf_header(path: &Path) -> Result<GgufHeader> {
    let io = |e| Error::io(path, e);
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(Error::artifact(path, None, "is not a regular file"));
    }
    let file = File::open(path).map_err(io)?;
    let mut c = Cursor { reader: BufReader::with_capacity(1 << 16, file), pos: 0, len: meta.len(), path };

    let magic: [u8; 4] = c.bytes("the GGUF magic")?;
    if &magic != MAGIC {
        return Err(c.bad(None, format!("starts with {magic:02x?}, not the GGUF magic \"GGUF\"")));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(c.bad(None, format!("GGUF version {version} is not served (2 and 3 are)")));
    }
    let tensor_count = c.u64("the tensor count")?;
    let kv_count = c.u64("the metadata count")?;
    for (count, what) in [(tensor_count, "tensors"), (kv_count, "metadata entries")] {
        if count > MAX_ENTRIES {
            return Err(c.bad(None, format!("declares {count} {what}, more than the {MAX_ENTRIES} accepted")));
        }
    }

    let mut metadata = BTreeMap::new();
    let mut keys_with_nul = BTreeSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        if metadata.contains_key(&key) {
            return Err(c.bad(Some(&key), "appears twice in the metadata"));
        }
        let code = c.u32("a metadata value type")?;
        let (kind, has_nul) = read_value(&mut c, &key, code)?;
        if has_nul {
            keys_with_nul.insert(key.clone());
        }
        if key == "general.alignment" {
            alignment = read_alignment(&mut c, &key, &kind)?;
        }
        metadata.insert(key, kind);
    }

    let mut infos = Vec::new();
    for _ in 0..tensor_count {
        let name = c.string("a tensor name")?;
        let n_dims = c.u32("a tensor's dimension count")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.bad(Some(&name), format!("has {n_dims} dimensions (1 to {MAX_DIMS} are served)")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64("a tensor dimension")?);
        }
        let code = c.u32("a tensor type")?;
        let offset = c.u64("a tensor offset")?;
        infos.push((name, ne, code, offset));
    }

    // The data section starts at the next multiple of the alignment.
    let data_start = c.pos.div_ceil(alignment).checked_mul(alignment).filter(|&s| s <= c.len);
    let data_start = data_start.ok_or_else(|| c.bad(None, "ends before its data section"))?;
    let mut tensors = BTreeMap::new();
    for (name, ne, code, offset) in infos {
        let info = tensor_info(&c, &name, &ne, code, offset, alignment, data_start)?;
        if tensors.insert(name.clone(), info).is_some() {
            return Err(c.bad(Some(&name), "appears twice among the tensors"));
        }
    }
    check_names_and_overlaps(&c, &tensors)?;
    Ok(GgufHeader { version, metadata, tensors, keys_with_nul })
}

/// Reads (numbers: skips, checking lengths) one metadata value of type `code`; says whether a
/// string in it holds a NUL byte.
fn read_value(c: &mut Cursor<'_>, key: &str, code: u32) -> Result<(MetadataKind, bool)> {
    let bad_type = |c: &Cursor<'_>, code: u32| c.bad(Some(key), format!("has unknown value type {code}"));
    if code == 9 {
        let element = c.u32("an array's element type")?;
        let len = c.u64("an array's length")?;
        if len > MAX_MLX_INT {
            return Err(c.bad(Some(key), format!("is an array of {len} values, more than MLX reads ({MAX_MLX_INT})")));
        }
        let len_usize = len as usize;
        return match ValueType::from_code(element) {
            Some(ValueType::String) => {
                let mut has_nul = false;
                for _ in 0..len {
                    has_nul |= c.value_string("an array's string")?.1;
                }
                Ok((MetadataKind::StringArray { len: len_usize }, has_nul))
            }
            Some(ValueType::Number { name, bytes }) => {
                c.skip(len * bytes, "an array's values")?;
                Ok((MetadataKind::NumberArray { element: name, len: len_usize }, false))
            }
            None if element == 9 => Err(c.bad(Some(key), "is an array of arrays, which MLX does not read")),
            None => Err(bad_type(c, element)),
        };
    }
    match ValueType::from_code(code) {
        Some(ValueType::String) => {
            let (bytes, has_nul) = c.value_string("a metadata string")?;
            Ok((MetadataKind::String { bytes }, has_nul))
        }
        Some(ValueType::Number { name, bytes }) => {
            c.skip(bytes, "a metadata number")?;
            Ok((MetadataKind::Number(name), false))
        }
        None => Err(bad_type(c, code)),
    }
}

/// `general.alignment`: a uint32 power of two, read back from the four bytes just skipped.
fn read_alignment(c: &mut Cursor<'_>, key: &str, kind: &MetadataKind) -> Result<u64> {
    if *kind != MetadataKind::Number("uint32") {
        return Err(c.bad(Some(key), format!("is {}, not a uint32", kind.describe())));
    }
    c.reader.seek_relative(-4).map_err(|e| Error::io(c.path, e))?;
    c.pos -= 4;
    let a = u64::from(c.u32("the alignment")?);
    if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
        return Err(c.bad(Some(key), format!("is {a}, not a power of two up to 2^20")));
    }
    Ok(a)
}

/// Checks one tensor's dimensions, type and data span; returns it in MLX's dimension order.
fn tensor_info(
    c: &Cursor<'_>,
    name: &str,
    ne: &[u64],
    code: u32,
    offset: u64,
    alignment: u64,
    data_start: u64,
) -> Result<TensorInfo> {
    let bad = |m: String| Err(c.bad(Some(name), m));
    let Some(ggml_type) = GgmlType::from_code(code) else {
        return bad(format!(
            "has GGML type {code}, which is not served (F32, F16, Q4_0, Q4_1, Q4_K, Q8_0, I8, I16, I32 are)"
        ));
    };
    if ne.iter().any(|&d| d == 0 || d > MAX_MLX_INT) {
        return bad(format!("has dimensions {ne:?} (innermost first): each must be 1 to {MAX_MLX_INT}"));
    }
    let elements = ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|&n| n <= MAX_MLX_INT);
    let Some(elements) = elements else {
        return bad(format!("has dimensions {ne:?}, more than the {MAX_MLX_INT} elements MLX reads"));
    };
    let (block_elems, block_bytes) = ggml_type.block();
    if !ne[0].is_multiple_of(block_elems) {
        let t = ggml_type.name();
        return bad(format!(
            "is {t} with an innermost dimension of {}, not a multiple of its {block_elems}-weight blocks",
            ne[0]
        ));
    }
    // `elements` fits 31 bits and a block is at most 144 bytes: no overflow.
    let bytes = elements / block_elems * block_bytes;
    if !offset.is_multiple_of(alignment) {
        return bad(format!("has data offset {offset}, not a multiple of the alignment {alignment}"));
    }
    let end = data_start.checked_add(offset).and_then(|s| s.checked_add(bytes));
    if end.is_none_or(|e| e > c.len) {
        return bad(format!(
            "has {bytes} bytes of data at offset {offset} of the data section, past the end of the file ({} bytes)",
            c.len
        ));
    }
    let shape = ne.iter().rev().map(|&d| d as usize).collect();
    Ok(TensorInfo { ggml_type, shape, file_offset: data_start + offset, bytes })
}

/// MLX names a quantized tensor's scales and biases by replacing its last 7 characters (its
/// `.weight`): such tensors must end in `.weight`, and no tensor may take a derived name. Tensor
/// data must not overlap.
fn check_names_and_overlaps(c: &Cursor<'_>, tensors: &BTreeMap<String, TensorInfo>) -> Result<()> {
    for (name, info) in tensors {
        if name.is_empty() || name.contains('\0') {
            return Err(c.bad(Some(name), "is not a usable tensor name (empty or with a NUL byte)"));
        }
        if info.ggml_type.quantized_bits().is_none() {
            continue;
        }
        let Some(prefix) = name.strip_suffix(".weight") else {
            return Err(c.bad(
                Some(name),
                "is quantized but its name does not end in \".weight\" (MLX derives its scales' name from it)",
            ));
        };
        for derived in [format!("{prefix}.scales"), format!("{prefix}.biases")] {
            if tensors.contains_key(&derived) {
                return Err(
                    c.bad(Some(&derived), format!("collides with the scales or biases MLX derives from {name:?}"))
                );
            }
        }
    }
    let mut spans: Vec<(u64, u64, &str)> = tensors.iter().map(|(n, t)| (t.file_offset, t.bytes, n.as_str())).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((a, a_len, a_name), (b, _, b_name)) = (pair[0], pair[1]);
        if a + a_len > b {
            return Err(c.bad(Some(b_name), format!("data overlaps that of {a_name:?}")));
        }
    }
    Ok(())
}
