//! Model artifacts on disk (docs/format.md §5): `config.json` plus `*.safetensors`, a single file or shards
//! listed in `model.safetensors.index.json`.
//!
//! A coded module `<path>` has the tensors `<path>.weight` (uint32 codes, either layout) and
//! `<path>.scales` (float16 `[rows]`), and an entry in the config's `quantization` (or
//! `quantization_config`) object:
//! `{"bits": k, "group_size": T, "mode": "trellis", "trellis": {"L": 12, "code": "1mad", "axis": 0}}`.
//! A module whose coded axis is rotated or padded (docs/format.md §10) also has `rotation` and/or
//! `logical_cols` in its `trellis` object and the tensor `<path>.rotation_signs`
//! (see [`coded_axis`](super::coded_axis)).
//!
//! Every problem with the files is an [`Error::Artifact`] naming the file and the key or tensor
//! (or [`Error::Io`] for the operating system's errors): JSON is parsed strictly (duplicate keys
//! refused, sizes capped), safetensors headers are validated before MLX reads them, every file
//! read resolves inside the model directory, and scales must be finite.
//!
//! An [`Artifact`] reads and validates each safetensors file's header once and keeps it (read
//! again only where the file's size or modification time changed): loading a module, an MLP or
//! a shard of one reuses it. The reading of one rank's rows for shard loads is in `shard.rs`.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Map, Value};

use crate::array::MlxArray;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::io::{load_safetensors_lazy, read_header, save_safetensors, Header};
use crate::json;
use crate::trellis::checks::{check_codes, check_scales};
use crate::trellis::linear::TrellisLinear;
use crate::trellis::mlp::TrellisMlp;
use crate::trellis::shard::RowShard;

use super::paths::{check_shard_name, ModelRoot};
use super::shard::{read_module_rows, OpenFiles};

/// A config is small even for large models; the cap bounds what a hostile one costs to parse.
const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// A shard index lists every tensor of the model, so it gets more room than the config.
const MAX_INDEX_BYTES: u64 = 64 << 20;

const CONFIG: &str = "config.json";
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// The trellis parameters of one module, as its config entry states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleConfig {
    /// Bits per weight.
    pub bits: u32,
    /// Block length `T`.
    pub group_size: u32,
    /// State bits.
    pub l: u32,
    /// 0 (stored `[in, out]`) or 1 (stored `[out, in]`).
    pub axis: u32,
}

/// A model directory opened for reading coded modules.
#[derive(Debug)]
pub struct Artifact {
    root: ModelRoot,
    config: Map<String, Value>,
    /// Tensor name to file, from the shard index (empty for a single file).
    weight_map: BTreeMap<String, String>,
    /// The validated header of each safetensors file read so far, by path.
    headers: Mutex<BTreeMap<PathBuf, CachedHeader>>,
}

/// A file's validated header and the file's size and modification time when it was read.
#[derive(Debug)]
struct CachedHeader {
    stamp: (u64, Option<SystemTime>),
    header: Arc<Header>,
}

/// Reads `path` as a JSON object, strictly and with a size cap.
fn read_object(path: &FsPath, cap: u64) -> Result<Map<String, Value>> {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let text = json::read_capped(path, cap, &name)?;
    match json::parse::<Value>(&text).map_err(|p| p.into_error(path))? {
        Value::Object(map) => Ok(map),
        other => Err(Error::artifact(path, None, format!("is not a JSON object (found {})", kind(&other)))),
    }
}

/// What kind of JSON value `v` is, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether `path` exists: `false` where it does not, an [`Error::Io`] naming it where it cannot
/// be looked at (a directory without permission), so that is not mistaken for a missing file.
fn present(path: &FsPath) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(path, e).context("the model directory cannot be read")),
    }
}

impl Artifact {
    /// Opens `dir`, reading `config.json` and, if present, `model.safetensors.index.json`. An
    /// index must list at least one tensor and every file it names must be a regular file in
    /// the directory (the index decides where every tensor is read from; a `model.safetensors`
    /// next to it is never used).
    pub fn open(dir: impl AsRef<FsPath>) -> Result<Artifact> {
        let root = ModelRoot::new(dir.as_ref())?;
        if !present(&root.dir.join(CONFIG))? {
            return Err(Error::artifact(&root.dir, None, "model directory has no config.json"));
        }
        let config_path = root.file(CONFIG, &root.dir, Some(CONFIG))?;
        let config = read_object(&config_path, MAX_CONFIG_BYTES)?;
        let mut weight_map = BTreeMap::new();
        if present(&root.dir.join(INDEX))? {
            let index_path = root.file(INDEX, &root.dir, Some(INDEX))?;
            let index = read_object(&index_path, MAX_INDEX_BYTES)?;
            let Some(map) = index.get("weight_map").and_then(Value::as_object) else {
                return Err(Error::artifact(&index_path, Some("weight_map"), "there is no \"weight_map\" object"));
            };
            if map.is_empty() {
                return Err(Error::artifact(&index_path, Some("weight_map"), "is empty: the index lists no tensor"));
            }
            let mut files = std::collections::BTreeSet::new();
            for (name, file) in map {
                let Some(file) = file.as_str() else {
                    let message = format!("weight_map entry is {}, not a file name", kind(file));
                    return Err(Error::artifact(&index_path, Some(name), message));
                };
                check_shard_name(&index_path, name, file)?;
                // Each named file is checked once, with the first tensor that names it.
                if files.insert(file) {
                    root.file(file, &index_path, Some(name)).map_err(|e| match e {
                        Error::Io { source, .. } => Error::artifact(
                            &index_path,
                            Some(name),
                            format!("shard file {file:?} cannot be read: {source}"),
                        ),
                        other => other,
                    })?;
                }
                weight_map.insert(name.clone(), file.to_string());
            }
        }
        Ok(Artifact { root, config, weight_map, headers: Mutex::default() })
    }

    fn config_path(&self) -> PathBuf {
        self.root.dir.join(CONFIG)
    }

    /// An [`Error::Artifact`] about `key` of `config.json`.
    pub(super) fn config_error(&self, key: &str, message: impl Into<String>) -> Error {
        Error::artifact(self.config_path(), Some(key), message)
    }

    /// The quantization object (`quantization`, else `quantization_config`) and its key.
    fn quantization(&self) -> Result<(&'static str, &Map<String, Value>)> {
        let (key, q) = match (self.config.get("quantization"), self.config.get("quantization_config")) {
            (Some(q), _) => ("quantization", q),
            (None, Some(q)) => ("quantization_config", q),
            (None, None) => {
                let message = "has neither \"quantization\" nor \"quantization_config\"";
                return Err(Error::artifact(self.config_path(), None, message));
            }
        };
        match q.as_object() {
            Some(q) => Ok((key, q)),
            None => Err(self.config_error(key, format!("is {}, not an object", kind(q)))),
        }
    }

    /// The file that the config's string entry `key` names (for example a base model that the
    /// coded modules replace layers of), resolved inside the model directory.
    pub fn config_file(&self, key: &str) -> Result<PathBuf> {
        let config = self.config_path();
        match self.config.get(key) {
            None => Err(self.config_error(key, "is missing")),
            Some(Value::String(name)) => self.root.file(name, &config, Some(key)),
            Some(other) => Err(self.config_error(key, format!("is {}, not a file name", kind(other)))),
        }
    }

    /// The names of the trellis-coded modules the config lists (in name order).
    pub fn trellis_modules(&self) -> Result<Vec<String>> {
        let (_, q) = self.quantization()?;
        Ok(q.iter()
            .filter(|(_, v)| v.get("mode").and_then(Value::as_str) == Some("trellis"))
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// The `trellis` object of `module`'s entry (checked by [`module_config`](Self::module_config)
    /// first) and its key path for messages.
    pub(super) fn trellis_object(&self, module: &str) -> Result<(String, &Map<String, Value>)> {
        self.module_config(module)?;
        let (qkey, q) = self.quantization()?;
        let at = format!("{qkey}/{module}/trellis");
        match q.get(module).and_then(|e| e.get("trellis")).and_then(Value::as_object) {
            Some(t) => Ok((at, t)),
            None => Err(self.config_error(&at, format!("module {module:?} has no \"trellis\" object"))),
        }
    }

    /// Whether tensor `name` exists in the artifact (the index, or the single file's header).
    pub(super) fn has_tensor(&self, name: &str) -> Result<bool> {
        if !self.weight_map.is_empty() {
            return Ok(self.weight_map.contains_key(name));
        }
        let file = self.file_of(name)?;
        Ok(self.header(&file)?.tensors.contains_key(name))
    }

    /// The parsed config entry of `module`.
    pub fn module_config(&self, module: &str) -> Result<ModuleConfig> {
        let (qkey, q) = self.quantization()?;
        let at =
            |rest: &str| if rest.is_empty() { format!("{qkey}/{module}") } else { format!("{qkey}/{module}/{rest}") };
        let Some(entry) = q.get(module) else {
            return Err(self.config_error(&at(""), format!("module {module:?} has no entry in {qkey:?}")));
        };
        let Some(entry) = entry.as_object() else {
            return Err(self.config_error(&at(""), format!("the quantization entry of {module:?} is not an object")));
        };
        match entry.get("mode").and_then(Value::as_str) {
            Some("trellis") => {}
            other => {
                let message = format!("module {module:?} has mode {other:?}, expected \"trellis\"");
                return Err(self.config_error(&at("mode"), message));
            }
        }
        let Some(trellis) = entry.get("trellis").and_then(Value::as_object) else {
            return Err(self.config_error(&at("trellis"), format!("module {module:?} has no \"trellis\" object")));
        };
        match trellis.get("code") {
            None => {}
            Some(c) if c.as_str() == Some("1mad") => {}
            Some(c) => {
                let message = format!("module {module:?} uses trellis code {c:?}; only \"1mad\" is supported");
                return Err(self.config_error(&at("trellis/code"), message));
            }
        }
        let int = |obj: &Map<String, Value>, name: &str, key: &str| -> Result<u32> {
            let Some(v) = obj.get(name) else {
                return Err(self.config_error(&at(key), format!("module {module:?} has no {key:?}")));
            };
            match v.as_u64().map(u32::try_from) {
                Some(Ok(n)) => Ok(n),
                _ => Err(self.config_error(
                    &at(key),
                    format!("{key:?} of module {module:?} is {v}, expected an integer in 0..=2^32-1"),
                )),
            }
        };
        Ok(ModuleConfig {
            bits: int(entry, "bits", "bits")?,
            group_size: int(entry, "group_size", "group_size")?,
            l: int(trellis, "L", "trellis/L")?,
            axis: int(trellis, "axis", "trellis/axis")?,
        })
    }

    /// The file that holds tensor `name`, checked to lie in the model directory.
    pub(super) fn file_of(&self, name: &str) -> Result<PathBuf> {
        if !self.weight_map.is_empty() {
            let index = self.root.dir.join(INDEX);
            return match self.weight_map.get(name) {
                Some(f) => self.root.file(f, &index, Some(name)),
                None => Err(Error::artifact(&index, Some(name), format!("tensor {name:?} is not listed in {INDEX}"))),
            };
        }
        if present(&self.root.dir.join(SINGLE))? {
            return self.root.file(SINGLE, &self.root.dir, Some(SINGLE));
        }
        Err(Error::artifact(&self.root.dir, None, format!("model directory has neither {SINGLE} nor {INDEX}")))
    }

    /// The validated header of the safetensors file `file` (a path [`Artifact::file_of`] gave),
    /// read and validated on first use and again only where the file's size or modification
    /// time changed since.
    pub(super) fn header(&self, file: &FsPath) -> Result<Arc<Header>> {
        let meta = std::fs::metadata(file).map_err(|e| Error::io(file, e))?;
        let stamp = (meta.len(), meta.modified().ok());
        // A panic elsewhere while the lock was held leaves a map that is still whole.
        let mut headers = self.headers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(cached) = headers.get(file).filter(|c| c.stamp == stamp) {
            return Ok(Arc::clone(&cached.header));
        }
        let header = Arc::new(read_header(file)?);
        headers.insert(file.to_path_buf(), CachedHeader { stamp, header: Arc::clone(&header) });
        Ok(header)
    }

    /// Tensor `name` of the lazily loaded files `loaded` (a file is loaded through MLX on first
    /// use, with its cached header), read from disk, and its file.
    pub(super) fn tensor(
        &self,
        loaded: &mut BTreeMap<PathBuf, BTreeMap<String, MlxArray>>,
        name: &str,
    ) -> Result<(PathBuf, MlxArray)> {
        let file = self.file_of(name)?;
        let tensors = match loaded.entry(file.clone()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(load_safetensors_lazy(&file, &*self.header(&file)?)?)
            }
        };
        let Some(t) = tensors.remove(name) else {
            return Err(Error::artifact(&file, Some(name), format!("tensor {name:?} is missing from this file")));
        };
        t.eval().map_err(|e| {
            let message = format!("reading it failed (truncated or corrupt file?): {}", e.message());
            Error::artifact(&file, Some(name), message)
        })?;
        Ok((file, t))
    }

    /// Loads the coded module `module` (its `.weight` and `.scales`), checked against the config.
    pub fn module(&self, module: &str) -> Result<TrellisLinear> {
        let cfg = self.module_config(module)?;
        let (wname, sname) = (format!("{module}.weight"), format!("{module}.scales"));
        // One MLX load per file: the codes and scales usually share one.
        let mut loaded = BTreeMap::new();
        let (wfile, codes) = self.tensor(&mut loaded, &wname)?;
        let geometry = check_codes(&wname, &codes, cfg.bits, cfg.group_size, cfg.l, cfg.axis)
            .map_err(|e| Error::artifact(&wfile, Some(&wname), e.message()))?;
        let (sfile, scales) = self.tensor(&mut loaded, &sname)?;
        check_scales(&wname, &scales, &geometry, &codes)
            .map_err(|e| Error::artifact(&sfile, Some(&sname), e.message()))?;
        let layer = self.attach_coded_axis(module, TrellisLinear::from_checked(&wname, codes, scales, geometry))?;
        self.check_model_dims(module, layer.in_features(), layer.out_features(), &geometry)?;
        Ok(layer)
    }

    /// Rank `shard.rank()`'s stored rows of the coded module `module` (see
    /// [`RowShard::rows`] for the rule), read from disk without reading the other rows. The
    /// codes' and scales' dtypes and shapes are checked against the config as
    /// [`Artifact::module`] checks them, and the scales read must be finite.
    pub fn module_shard(&self, module: &str, shard: RowShard) -> Result<TrellisLinear> {
        read_module_rows(self, &mut OpenFiles::default(), module, shard, None)
    }

    /// Rank `rank`'s shard of `count` of the MLP `PREFIX.{gate,up,down}_proj` (see
    /// [`TrellisMlp::shard`]), each projection's rows read from disk alone. Refused unless the
    /// config stores gate and up on axis 1 and down on axis 0.
    pub fn mlp_shard(&self, prefix: &str, rank: usize, count: usize) -> Result<TrellisMlp> {
        let load = || {
            let shard = RowShard::new(rank, count)?;
            let mut files = OpenFiles::default();
            let mut part =
                |name: &str, axis| read_module_rows(self, &mut files, &format!("{prefix}.{name}"), shard, Some(axis));
            TrellisMlp::new(part("gate_proj", 1)?, part("up_proj", 1)?, part("down_proj", 0)?)
        };
        load().with_context(|| format!("shard {rank} of {count} of MLP {prefix:?}"))
    }

    /// Where the config states the model's widths, an MLP projection must have them (its logical
    /// `in_features -> out_features`; `g` is its stored geometry, for messages).
    pub(super) fn check_model_dims(
        &self,
        module: &str,
        in_features: usize,
        out_features: usize,
        g: &crate::trellis::TrellisGeometry,
    ) -> Result<()> {
        let dim = |key: &str| -> Result<Option<usize>> {
            match self.config.get(key) {
                None => Ok(None),
                Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) => Ok(Some(n)),
                    None => Err(self.config_error(key, format!("is {v}, expected a non-negative integer"))),
                },
            }
        };
        let (Some(hidden), Some(inter)) = (dim("hidden_size")?, dim("intermediate_size")?) else {
            return Ok(());
        };
        let expected = if module.ends_with("down_proj") {
            (inter, hidden)
        } else if module.ends_with("gate_proj") || module.ends_with("up_proj") {
            (hidden, inter)
        } else {
            return Ok(());
        };
        if (in_features, out_features) != expected {
            let message = format!(
                "module {module:?}: codes give a {} -> {} map ({g}) but config.json's hidden_size {hidden} and intermediate_size {inter} say {} -> {}",
                in_features,
                out_features,
                expected.0,
                expected.1
            );
            return Err(self.config_error(module, message));
        }
        Ok(())
    }
}

/// The config entry of a layer.
fn module_entry(layer: &TrellisLinear) -> Value {
    let g = layer.geometry();
    let mut entry = serde_json::json!({
        "bits": g.k,
        "group_size": g.t,
        "mode": "trellis",
        "trellis": { "L": g.l, "code": "1mad", "axis": g.axis },
    });
    if let Some(trellis) = entry.get_mut("trellis").and_then(Value::as_object_mut) {
        for (key, value) in super::coded_axis::entry_keys(layer) {
            trellis.insert(key.to_string(), value);
        }
    }
    entry
}

/// Checks that an artifact can be written to `dir` before the work that makes it: `dir` is a
/// directory (created, with its parents, if missing) in which a file can be created, and it
/// holds no `model.safetensors.index.json` (see [`write_artifact`]).
pub fn check_artifact_dir(dir: impl AsRef<FsPath>) -> Result<()> {
    let dir = dir.as_ref();
    if dir.as_os_str().is_empty() {
        invalid!("empty path: name the directory to write the artifact to");
    }
    if dir.exists() && !dir.is_dir() {
        return Err(Error::artifact(dir, None, "is not a directory (an artifact is a directory of files)"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e).context("creating the artifact's directory"))?;
    let index = dir.join(INDEX);
    if present(&index)? {
        let message = "is left from another model: it would decide where every tensor is read from instead of the new model.safetensors; remove it (and its shards) or write to another directory";
        return Err(Error::artifact(index, None, message));
    }
    let probe = dir.join(format!(".mlx-trellis-write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| Error::io(dir, e).context("the artifact's directory is not writable"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Writes `modules` (name, layer) to `dir` as one `model.safetensors` and a `config.json` whose
/// `quantization` and `quantization_config` list them. `extra` members (for example
/// `hidden_size`) are written into the config too; they may not be `quantization` or
/// `quantization_config`, and names may not repeat.
///
/// A directory that holds a `model.safetensors.index.json` is refused ([`check_artifact_dir`]):
/// the index would win over the new `model.safetensors` when the artifact is opened. Each file
/// is written under a temporary name and renamed into place, so a reader never sees part of one.
pub fn write_artifact(
    dir: impl AsRef<FsPath>,
    modules: &[(&str, &TrellisLinear)],
    extra: &[(&str, Value)],
) -> Result<()> {
    let dir = dir.as_ref();
    let mut config = Map::new();
    for (key, value) in extra {
        if matches!(*key, "quantization" | "quantization_config") {
            invalid!("write_artifact: {key:?} is written from the modules, not from the extra members");
        }
        if config.insert(key.to_string(), value.clone()).is_some() {
            invalid!("write_artifact: extra member {key:?} is given twice");
        }
    }
    let mut names = Vec::new();
    let mut signs = Vec::new();
    let mut quant = Map::new();
    for (name, layer) in modules {
        if quant.insert(name.to_string(), module_entry(layer)).is_some() {
            invalid!("write_artifact: module {name:?} is given twice");
        }
        names.push((format!("{name}.weight"), layer.codes()));
        names.push((format!("{name}.scales"), layer.scales()));
        if let Some(s) = super::coded_axis::signs_tensor(layer)? {
            signs.push((super::coded_axis::signs_name(name), s));
        }
    }
    names.extend(signs.iter().map(|(n, a)| (n.clone(), a)));
    config.insert("quantization".into(), Value::Object(quant.clone()));
    config.insert("quantization_config".into(), Value::Object(quant));
    check_artifact_dir(dir)?;
    let tensors: Vec<(&str, &MlxArray)> = names.iter().map(|(n, a)| (n.as_str(), *a)).collect();
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    save_safetensors(dir.join(SINGLE), tensors, &meta)?;
    let path = dir.join(CONFIG);
    let text = serde_json::to_string_pretty(&Value::Object(config)).map_err(|e| Error::invalid(e.to_string()))?;
    let temporary = dir.join(format!(".{CONFIG}.{}.tmp", std::process::id()));
    let written = std::fs::write(&temporary, text + "\n")
        .and_then(|()| std::fs::rename(&temporary, &path))
        .map_err(|e| Error::io(&path, e));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::READS;
    use crate::trellis::{synthetic_mlp, CodeLayout};

    /// The MLP of `synthetic_mlp(hidden, inter, 2, ..)` as layers named `m.*_proj`.
    fn layers(hidden: usize, inter: usize, seed: u64) -> Vec<(&'static str, TrellisLinear)> {
        let (g, u, d) = synthetic_mlp(hidden, inter, 2, CodeLayout::RowMajor, seed).unwrap();
        [("m.gate_proj", g), ("m.up_proj", u), ("m.down_proj", d)]
            .into_iter()
            .map(|(n, h)| (n, TrellisLinear::from_host(n, &h).unwrap()))
            .collect()
    }

    fn write(dir: &FsPath, layers: &[(&'static str, TrellisLinear)]) {
        let modules: Vec<(&str, &TrellisLinear)> = layers.iter().map(|(n, l)| (*n, l)).collect();
        write_artifact(dir, &modules, &[]).unwrap();
    }

    #[test]
    fn each_header_is_read_once_per_artifact_until_its_file_changes() {
        let dir = std::env::temp_dir().join(format!("mlx-trellis-header-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = layers(256, 512, 3);
        write(&dir, &first);
        let reads = || READS.with(|n| n.get());
        let art = Artifact::open(&dir).unwrap();
        let before = reads();
        let whole = TrellisMlp::from_artifact(&art, "m").unwrap();
        art.module("m.down_proj").unwrap();
        art.mlp_shard("m", 1, 2).unwrap();
        art.module_shard("m.gate_proj", RowShard::new(0, 2).unwrap()).unwrap();
        assert_eq!(reads() - before, 1, "one file, one header read for every load");
        assert_eq!(whole.down().to_host().unwrap().codes, first[2].1.to_host().unwrap().codes);
        // A file rewritten with other contents (here: other widths) is read again.
        write(&dir, &layers(256, 256, 4));
        assert_eq!(art.module("m.up_proj").unwrap().geometry().rows, 256);
        assert_eq!(reads() - before, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
