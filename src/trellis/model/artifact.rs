//! Model artifacts on disk (spec §5): `config.json` plus `*.safetensors`, a single file or shards
//! listed in `model.safetensors.index.json`.
//!
//! A coded module `<path>` has the tensors `<path>.weight` (uint32 codes, either layout) and
//! `<path>.scales` (float16 `[rows]`), and an entry in the config's `quantization` (or
//! `quantization_config`) object:
//! `{"bits": k, "group_size": T, "mode": "trellis", "trellis": {"L": 12, "code": "1mad", "axis": 0}}`.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};

use crate::array::MlxArray;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::io::{load_safetensors_lazy, save_safetensors};

use super::json::Json;
use crate::trellis::linear::TrellisLinear;

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
    dir: PathBuf,
    config: Json,
    /// Tensor name to file, from the shard index (empty for a single file).
    weight_map: BTreeMap<String, String>,
}

fn read_json(path: &FsPath) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Json::parse(&text).map_err(|e| Error::artifact(path, None, format!("is not valid JSON: {e}")))
}

fn small_int(v: Option<&Json>, what: &str, module: &str) -> Result<u32> {
    let Some(v) = v else {
        invalid!("config.json: module {module:?} has no {what:?}");
    };
    match v.as_u64() {
        Some(n) if n <= u32::MAX as u64 => Ok(n as u32),
        _ => invalid!("config.json: {what:?} of module {module:?} is {v:?}, expected a non-negative integer"),
    }
}

impl Artifact {
    /// Opens `dir`, reading `config.json` and, if present, `model.safetensors.index.json`.
    pub fn open(dir: impl AsRef<FsPath>) -> Result<Artifact> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            invalid!("model directory {} has no config.json", dir.display());
        }
        let config = read_json(&config_path)?;
        let index_path = dir.join("model.safetensors.index.json");
        let mut weight_map = BTreeMap::new();
        if index_path.is_file() {
            let index = read_json(&index_path)?;
            let Some(map) = index.get("weight_map").and_then(Json::members) else {
                invalid!("{} has no \"weight_map\" object", index_path.display());
            };
            for (name, file) in map {
                let Some(file) = file.as_str() else {
                    invalid!("{}: weight_map entry {name:?} is not a file name", index_path.display());
                };
                weight_map.insert(name.clone(), file.to_string());
            }
        }
        Ok(Artifact { dir, config, weight_map })
    }

    /// The quantization object (`quantization`, else `quantization_config`).
    fn quantization(&self) -> Result<&Json> {
        self.config.get("quantization").or_else(|| self.config.get("quantization_config")).ok_or_else(|| {
            Error::artifact(
                self.dir.join("config.json"),
                None,
                "has neither \"quantization\" nor \"quantization_config\"",
            )
        })
    }

    /// The names of the trellis-coded modules the config lists.
    pub fn trellis_modules(&self) -> Result<Vec<String>> {
        let q = self.quantization()?;
        Ok(q.members()
            .unwrap_or(&[])
            .iter()
            .filter(|(_, v)| v.get("mode").and_then(Json::as_str) == Some("trellis"))
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// The parsed config entry of `module`.
    pub fn module_config(&self, module: &str) -> Result<ModuleConfig> {
        let q = self.quantization()?;
        let Some(entry) = q.get(module) else {
            invalid!("config.json: module {module:?} has no entry in \"quantization\"");
        };
        if entry.members().is_none() {
            invalid!("config.json: the quantization entry of {module:?} is not an object");
        }
        match entry.get("mode").and_then(Json::as_str) {
            Some("trellis") => {}
            other => invalid!("config.json: module {module:?} has mode {other:?}, expected \"trellis\""),
        }
        let Some(trellis) = entry.get("trellis").filter(|t| t.members().is_some()) else {
            invalid!("config.json: module {module:?} has no \"trellis\" object");
        };
        match trellis.get("code") {
            None => {}
            Some(c) if c.as_str() == Some("1mad") => {}
            Some(c) => invalid!("config.json: module {module:?} uses trellis code {c:?}; only \"1mad\" is supported"),
        }
        Ok(ModuleConfig {
            bits: small_int(entry.get("bits"), "bits", module)?,
            group_size: small_int(entry.get("group_size"), "group_size", module)?,
            l: small_int(trellis.get("L"), "trellis.L", module)?,
            axis: small_int(trellis.get("axis"), "trellis.axis", module)?,
        })
    }

    /// The file that holds tensor `name`.
    fn file_of(&self, name: &str) -> Result<PathBuf> {
        if !self.weight_map.is_empty() {
            return match self.weight_map.get(name) {
                Some(f) => Ok(self.dir.join(f)),
                None => {
                    invalid!("tensor {name:?} is not listed in model.safetensors.index.json of {}", self.dir.display())
                }
            };
        }
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            return Ok(single);
        }
        invalid!("{} has neither model.safetensors nor model.safetensors.index.json", self.dir.display())
    }

    fn tensor(&self, name: &str) -> Result<MlxArray> {
        let file = self.file_of(name)?;
        let mut tensors = load_safetensors_lazy(&file)?;
        let Some(t) = tensors.remove(name) else {
            invalid!("tensor {name:?} is missing from {}", file.display());
        };
        t.eval()
            .with_context(|| format!("reading tensor {name:?} from {} (truncated or corrupt file?)", file.display()))?;
        Ok(t)
    }

    /// Loads the coded module `module` (its `.weight` and `.scales`), checked against the config.
    pub fn module(&self, module: &str) -> Result<TrellisLinear> {
        let cfg = self.module_config(module)?;
        let codes = self.tensor(&format!("{module}.weight"))?;
        let scales = self.tensor(&format!("{module}.scales"))?;
        let layer =
            TrellisLinear::new(&format!("{module}.weight"), codes, scales, cfg.bits, cfg.group_size, cfg.l, cfg.axis)
                .with_context(|| format!("module {module:?} in {}", self.dir.display()))?;
        self.check_model_dims(module, &layer)?;
        Ok(layer)
    }

    /// Where the config states the model's widths, an MLP projection must have them.
    fn check_model_dims(&self, module: &str, layer: &TrellisLinear) -> Result<()> {
        let dim = |key: &str| self.config.get(key).and_then(Json::as_u64).map(|v| v as usize);
        let (Some(hidden), Some(inter)) = (dim("hidden_size"), dim("intermediate_size")) else {
            return Ok(());
        };
        let expected = if module.ends_with("down_proj") {
            (inter, hidden)
        } else if module.ends_with("gate_proj") || module.ends_with("up_proj") {
            (hidden, inter)
        } else {
            return Ok(());
        };
        let g = layer.geometry();
        if (g.in_features(), g.out_features()) != expected {
            invalid!(
                "module {module:?}: codes give a {} -> {} map ({g}) but config.json's hidden_size {hidden} and intermediate_size {inter} say {} -> {}",
                g.in_features(),
                g.out_features(),
                expected.0,
                expected.1
            );
        }
        Ok(())
    }
}

/// The config entry of a layer.
fn module_entry(layer: &TrellisLinear) -> Json {
    let g = layer.geometry();
    let n = |v: u32| Json::Number(v as f64);
    Json::Object(vec![
        ("bits".into(), n(g.k)),
        ("group_size".into(), n(g.t)),
        ("mode".into(), Json::String("trellis".into())),
        (
            "trellis".into(),
            Json::Object(vec![
                ("L".into(), n(g.l)),
                ("code".into(), Json::String("1mad".into())),
                ("axis".into(), n(g.axis)),
            ]),
        ),
    ])
}

/// Writes `modules` (name, layer) to `dir` as one `model.safetensors` and a `config.json` whose
/// `quantization` and `quantization_config` list them. `extra` members (for example
/// `hidden_size`) are written into the config first.
pub fn write_artifact(
    dir: impl AsRef<FsPath>,
    modules: &[(&str, &TrellisLinear)],
    extra: &[(&str, Json)],
) -> Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut names = Vec::new();
    let mut quant = Vec::new();
    for (name, layer) in modules {
        names.push((format!("{name}.weight"), layer.codes()));
        names.push((format!("{name}.scales"), layer.scales()));
        quant.push((name.to_string(), module_entry(layer)));
    }
    let tensors: Vec<(&str, &MlxArray)> = names.iter().map(|(n, a)| (n.as_str(), *a)).collect();
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    save_safetensors(dir.join("model.safetensors"), tensors, &meta)?;
    let mut config: Vec<(String, Json)> = extra.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    config.push(("quantization".into(), Json::Object(quant.clone())));
    config.push(("quantization_config".into(), Json::Object(quant)));
    let path = dir.join("config.json");
    std::fs::write(&path, Json::Object(config).to_pretty()).map_err(|e| Error::io(&path, e))?;
    Ok(())
}
