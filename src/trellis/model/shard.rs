//! Reading one rank's rows of a coded module from disk ([`Artifact::module_shard`] and
//! [`Artifact::mlp_shard`] call [`read_module_rows`]): only its stored rows are read from the
//! safetensors file, never the whole layer.
//!
//! The file's header is the artifact's validated one (see [`crate::io`]), which also proves every
//! tensor's bytes lie inside the file. The rows of the shard are then read with seeks: one
//! contiguous range of row-major codes `[R, W]` and of the scales `[R]`, and one range per
//! 512-column group of the 3-bit interleave `[C/512, R, 48]`. MLX's own loader would map or read
//! the whole tensor. One load opens each file once, however many of its tensors it reads.

use std::collections::btree_map::{BTreeMap, Entry};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use half::f16;

use crate::alloc::try_with_capacity;
use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::io::TensorEntry;
use crate::trellis::checks::check_codes;
use crate::trellis::format::{CodeLayout, TrellisGeometry};
use crate::trellis::linear::TrellisLinear;
use crate::trellis::shard::{check_rule_axis, RowShard};

use super::artifact::Artifact;

/// Bytes read at a time (a multiple of every element size).
const CHUNK: usize = 1 << 20;

/// The files one load has opened, by path.
#[derive(Default)]
pub(super) struct OpenFiles(BTreeMap<PathBuf, File>);

impl OpenFiles {
    /// The handle of `path`, opened on first use.
    fn handle(&mut self, path: &Path) -> Result<&mut File> {
        Ok(match self.0.entry(path.to_path_buf()) {
            Entry::Occupied(open) => open.into_mut(),
            Entry::Vacant(slot) => slot.insert(crate::files::open_regular_file(path)?),
        })
    }
}

/// One tensor's entry in its file, with where its data starts.
struct Located {
    file: PathBuf,
    entry: TensorEntry,
    /// The tensor's first byte in the file.
    start: u64,
}

/// Finds tensor `name` in its file's validated header.
fn locate(artifact: &Artifact, name: &str) -> Result<Located> {
    let file = artifact.file_of(name)?;
    let header = artifact.header(&file)?;
    let Some(entry) = header.tensors.get(name) else {
        return Err(Error::artifact(&file, Some(name), format!("tensor {name:?} is missing from this file")));
    };
    let start = header.data_start + entry.offsets.0 as u64;
    Ok(Located { file, entry: entry.clone(), start })
}

/// Rank `shard.rank()`'s stored rows of the coded module `module` of `artifact`, through the
/// files `files` has opened; `axis`, where given, is the axis the row rule needs the module
/// stored on.
pub(super) fn read_module_rows(
    artifact: &Artifact,
    files: &mut OpenFiles,
    module: &str,
    shard: RowShard,
    axis: Option<u32>,
) -> Result<TrellisLinear> {
    let cfg = artifact.module_config(module)?;
    let (wname, sname) = (format!("{module}.weight"), format!("{module}.scales"));
    let w = locate(artifact, &wname)?;
    let refuse = |l: &Located, key: &str, m: String| Error::artifact(&l.file, Some(key), m);
    if w.entry.dtype != Dtype::Uint32 {
        return Err(refuse(&w, &wname, format!("trellis codes are {}, expected uint32", w.entry.dtype)));
    }
    let g = TrellisGeometry::from_codes_shape(&wname, &w.entry.shape, cfg.bits, cfg.group_size, cfg.l, cfg.axis)
        .map_err(|e| refuse(&w, &wname, e.message()))?;
    if let Some(want) = axis {
        check_rule_axis(&format!("module {module:?}"), g.axis, want)?;
    }
    let coded_axis = artifact.coded_axis(module, &g)?;
    let (logical_in, logical_out) = match g.axis {
        0 => (g.rows, coded_axis.logical),
        _ => (coded_axis.logical, g.rows),
    };
    artifact.check_model_dims(module, logical_in, logical_out, &g)?;
    let rows = shard.rows(g.rows, &format!("module {module:?}"))?;
    let s = locate(artifact, &sname)?;
    if s.entry.dtype != Dtype::Float16 {
        return Err(refuse(&s, &sname, format!("trellis scales of {wname:?} are {}, expected float16", s.entry.dtype)));
    }
    if s.entry.shape != [g.rows] {
        let m = format!(
            "trellis scales of {wname:?} have shape {:?}, expected [{}] (one per stored row of codes {:?})",
            s.entry.shape, g.rows, w.entry.shape
        );
        return Err(refuse(&s, &sname, m));
    }
    let n = rows.len();
    let (spans, shape) = match g.layout() {
        CodeLayout::RowMajor => {
            let row_bytes = w.entry.shape[1] as u64 * 4;
            (vec![(w.start + rows.start as u64 * row_bytes, n as u64 * row_bytes)], vec![n, w.entry.shape[1]])
        }
        CodeLayout::K3Interleaved => {
            let (groups, slot) = (w.entry.shape[0], 48 * 4);
            let spans = (0..groups as u64)
                .map(|grp| (w.start + (grp * g.rows as u64 + rows.start as u64) * slot, n as u64 * slot))
                .collect();
            (spans, vec![groups, n, 48])
        }
    };
    let words = read_le(files.handle(&w.file)?, &w.file, &wname, &spans, u32::from_le_bytes)?;
    let scale_span = [(s.start + rows.start as u64 * 2, n as u64 * 2)];
    let scales = read_le(files.handle(&s.file)?, &s.file, &sname, &scale_span, |b: [u8; 2]| {
        f16::from_bits(u16::from_le_bytes(b))
    })?;
    if let Some((i, v)) = scales.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        let m = format!("the scale of stored row {} is {v}; scales must be finite", rows.start + i);
        return Err(refuse(&s, &sname, m));
    }
    let codes = MlxArray::from_slice(&words, &shape)?;
    let geometry = check_codes(&wname, &codes, g.k, g.t, g.l, g.axis)?;
    let scales = MlxArray::from_slice(&scales, &[n])?;
    // A row shard keeps the stored columns, so the module's coded axis applies unchanged.
    TrellisLinear::from_checked(&wname, codes, scales, geometry).with_coded_axis(coded_axis)
}

/// Reads the byte ranges `spans` (file offset, length) of tensor `key` from `file` (at `path`)
/// as little-endian elements of `N` bytes each.
fn read_le<const N: usize, T>(
    file: &mut File,
    path: &Path,
    key: &str,
    spans: &[(u64, u64)],
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    let total: u64 = spans.iter().map(|s| s.1).sum();
    let count = usize::try_from(total / N as u64).map_err(|_| Error::invalid(format!("{total} bytes of {key:?}")))?;
    let mut out = try_with_capacity(count, || format!("the rows of {key:?} to read"))?;
    let mut buf = vec![0u8; CHUNK];
    for &(offset, len) in spans {
        file.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(path, e))?;
        let mut left = len;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            file.read_exact(&mut buf[..n]).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::artifact(
                    path,
                    Some(key),
                    "the file ends inside this tensor's rows (it changed after its header was read?)",
                ),
                _ => Error::io(path, e),
            })?;
            out.extend(buf[..n].chunks_exact(N).map(|c| decode(c.try_into().expect("chunks of N bytes"))));
            left -= n as u64;
        }
    }
    Ok(out)
}
