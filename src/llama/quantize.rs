//! Whole-model quantization: the linear projections of a Llama-architecture GGUF model coded
//! into a trellis artifact that the model runner loads.
//!
//! [`quantize_model`] reads each chosen projection of every block dequantized to f32, codes it
//! with [`code_linear`] (the coded axis chosen by the rule of docs/format.md §10, rotated by default,
//! padded where neither dimension is a whole number of 256-weight blocks), and writes to the
//! output directory:
//!
//! - `model.safetensors`: the coded modules under their Hugging Face names
//!   (`model.layers.N.mlp.gate_proj`, `...self_attn.q_proj`, ...): codes, scales and, where
//!   rotated, the rotation signs;
//! - `config.json`: the modules' `quantization` (and `quantization_config`) entries, the model's
//!   `hidden_size` and `intermediate_size`, and `"base_gguf": "base.gguf"`;
//! - `base.gguf`: the source model (a hard link where the file system allows one, else a copy),
//!   from which the runner takes every tensor that is not coded, as shipped.
//!
//! A stale `model.safetensors.index.json` in the directory is removed (it would take precedence
//! over the new single file); the safetensors and the config are written to a temporary folder
//! inside the directory and renamed into place, the config last.
//!
//! Rotation seeds: a projection stored `[out, in]` (axis 1) takes the seed of its input (every
//! axis-1 projection of one input shares one rotation, so a runner can rotate that input once:
//! q/k/v share `model.layers.N.self_attn.input`, gate/up `model.layers.N.mlp.input`); any other
//! takes its own name's. The seed of a key is its 64-bit FNV-1a hash xor [`QuantizeSpec::seed`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use crate::dtype::Dtype;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::io::gguf::Gguf;
use crate::trellis::encoder::{code_linear, EncoderBackend, EncoderConfig, RotationSpec};
use crate::trellis::format::CodeLayout;
use crate::trellis::{write_artifact, TrellisLinear};

use super::names::{gguf_tensor_name, hf_module, is_mlp, LINEARS};

/// The conventional coded axis of a projection (docs/format.md §10): 0 (along the outputs) for the
/// down projection, 1 (along the inputs) for the others.
fn conventional_axis(linear: &str) -> u32 {
    if linear == "mlp.down_proj" {
        0
    } else {
        1
    }
}

/// The name of the copied source model inside the output directory.
pub const BASE_GGUF: &str = "base.gguf";

/// What [`quantize_model`] codes, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeSpec {
    /// Bits per weight (2, 3 or 4) of every coded projection without an override.
    pub bits: u32,
    /// Bits per weight of single projections, by Hugging Face module name
    /// (`model.layers.3.mlp.down_proj`); every name must be a coded projection.
    pub bits_overrides: BTreeMap<String, u32>,
    /// Code the attention projections (q, k, v, o) too, not only the MLP's.
    pub attention: bool,
    /// Code only the first this many blocks (`None`: every block); the others stay as shipped.
    pub layers: Option<usize>,
    /// Rotate the coded axis of every projection (docs/format.md §10). Without it real layers lose
    /// their outlier weights to the codebook's range: keep it on.
    pub rotation: bool,
    /// Mixed into every rotation seed.
    pub seed: u64,
    /// Trellis state bits `L`.
    pub l: u32,
    /// Encoder threads (`None`: one per core).
    pub threads: Option<usize>,
    /// Where the encoder's block search runs.
    pub backend: EncoderBackend,
}

impl Default for QuantizeSpec {
    /// k 4 MLPs, rotated, L 12, seed 0, one thread per core, the search where it runs best.
    fn default() -> QuantizeSpec {
        QuantizeSpec {
            bits: 4,
            bits_overrides: BTreeMap::new(),
            attention: false,
            layers: None,
            rotation: true,
            seed: 0,
            l: 12,
            threads: None,
            backend: EncoderBackend::Auto,
        }
    }
}

/// One coded projection, as [`quantize_model`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleReport {
    /// 1-based position among the coded projections.
    pub index: usize,
    /// How many projections are coded.
    pub total: usize,
    /// Hugging Face module name.
    pub module: String,
    /// `[out, in]` of the dense weight.
    pub shape: [usize; 2],
    /// The coded axis (0 or 1).
    pub axis: u32,
    /// Logical and stored length of the coded axis.
    pub coded_len: (usize, usize),
    /// Bits per weight.
    pub bits: u32,
    /// The rotation block, if rotated.
    pub rotation_block: Option<usize>,
    /// `mse / mean w²` of the decoded weights against the dense ones.
    pub relative_mse: f64,
    /// Stored bits (codes, scales, signs) over the logical weights.
    pub bits_per_weight: f64,
    /// Seconds spent coding it.
    pub seconds: f64,
}

/// What [`quantize_model`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Every coded projection, in order.
    pub modules: Vec<ModuleReport>,
    /// Stored bits over logical weights of all coded projections together.
    pub bits_per_weight: f64,
    /// The output directory.
    pub out_dir: PathBuf,
}

/// 64-bit FNV-1a of `key`.
fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The rotation seed of `module` coded on `axis` (see the module documentation).
pub fn rotation_seed(module: &str, axis: u32, seed: u64) -> u64 {
    let key = match (axis, module.rsplit_once('.')) {
        (1, Some((prefix, "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj"))) => format!("{prefix}.input"),
        _ => module.to_string(),
    };
    fnv1a(&key) ^ seed
}

/// Stored bits of a coded layer (codes, f16 scales, f16 signs) over its logical weights.
fn stored_bits(layer: &TrellisLinear) -> (f64, f64) {
    let g = layer.geometry();
    let signs = layer.rotation().map_or(0, |r| r.len());
    let bits = (g.code_words() * 32 + g.rows * 16 + signs * 16) as f64;
    (bits, (layer.in_features() * layer.out_features()) as f64)
}

/// Codes the projections of the GGUF model `gguf_path` by `spec` into `out_dir` (see the module
/// documentation), calling `progress` after each one. The output directory is created if
/// needed; files other than the ones written (and a stale shard index) are left alone.
pub fn quantize_model(
    gguf_path: impl AsRef<Path>,
    spec: &QuantizeSpec,
    out_dir: impl AsRef<Path>,
    progress: &mut dyn FnMut(&ModuleReport),
) -> Result<QuantizeReport> {
    let (gguf_path, out_dir) = (gguf_path.as_ref(), out_dir.as_ref());
    check_bits("bits", spec.bits)?;
    for (name, &k) in &spec.bits_overrides {
        check_bits(name, k)?;
    }
    let gguf = Gguf::open(gguf_path)?;
    let arch = gguf.metadata_string("general.architecture")?;
    if arch != "llama" {
        return Err(Error::artifact(
            gguf_path,
            Some("general.architecture"),
            format!("is {arch:?}; only \"llama\" models are coded"),
        ));
    }
    let count = |key: &str| -> Result<usize> {
        let v = gguf.metadata_u64(key)?;
        usize::try_from(v).map_err(|_| Error::artifact(gguf_path, Some(key), format!("{v} does not fit a size")))
    };
    let (layers, hidden, inter) =
        (count("llama.block_count")?, count("llama.embedding_length")?, count("llama.feed_forward_length")?);

    let coded_layers = match spec.layers {
        Some(n) if n > layers => invalid!("quantize_model: {n} blocks asked for, the model has {layers}"),
        Some(n) => n,
        None => layers,
    };
    let mut plan = Vec::new();
    for n in 0..coded_layers {
        for linear in LINEARS {
            if is_mlp(linear) || spec.attention {
                let module = hf_module(n, linear);
                let tensor = gguf_tensor_name(&module)?;
                plan.push((module, tensor, conventional_axis(linear)));
            }
        }
    }
    if let Some(name) = spec.bits_overrides.keys().find(|name| !plan.iter().any(|(m, _, _)| m == *name)) {
        invalid!("quantize_model: the bits override {name:?} names no coded projection of this model");
    }

    let mut coded = Vec::with_capacity(plan.len());
    let mut reports = Vec::with_capacity(plan.len());
    let (mut all_bits, mut all_weights) = (0f64, 0f64);
    for (i, (module, tensor, conventional)) in plan.iter().enumerate() {
        let start = Instant::now();
        let k = spec.bits_overrides.get(module).copied().unwrap_or(spec.bits);
        let layer = (|| {
            let w = gguf.dense_f32(tensor)?;
            let [out, inf] = w.try_shape()?[..] else {
                invalid!("{tensor} has shape {:?}, expected a 2-D weight [out, in]", w.shape());
            };
            let w = w.astype(Dtype::Float32)?.to_vec::<f32>()?;
            let mut cfg = EncoderConfig {
                axis: *conventional,
                threads: spec.threads,
                backend: spec.backend,
                ..EncoderConfig::new(k, spec.l)
            };
            let choice = crate::trellis::encoder::choose_axis(out, inf, cfg.axis, cfg.t as usize)?;
            if spec.rotation {
                cfg.rotation = Some(RotationSpec { seed: rotation_seed(module, choice.axis, spec.seed) });
            }
            // The 3-bit block interleave is what the axis-0 kernels read fastest.
            if k == 3 && spec.l == 12 && choice.axis == 0 && choice.stored % 512 == 0 {
                cfg.layout = CodeLayout::K3Interleaved;
            }
            let c = code_linear(&w, out, inf, &cfg, &mut |_, _| {})?;
            let layer = c.to_linear(module)?;
            let (bits, weights) = stored_bits(&layer);
            let report = ModuleReport {
                index: i + 1,
                total: plan.len(),
                module: module.clone(),
                shape: [out, inf],
                axis: choice.axis,
                coded_len: (choice.logical, choice.stored),
                bits: k,
                rotation_block: c.coded_axis.rotation.as_ref().map(|r| r.block()),
                relative_mse: c.relative_mse(),
                bits_per_weight: bits / weights,
                seconds: start.elapsed().as_secs_f64(),
            };
            Ok((layer, report, bits, weights))
        })()
        .with_context(|| format!("coding {tensor} of {} as {module}", gguf_path.display()))?;
        let (layer, report, bits, weights) = layer;
        all_bits += bits;
        all_weights += weights;
        progress(&report);
        reports.push(report);
        coded.push((module.clone(), layer));
    }

    write_model_dir(gguf_path, out_dir, &coded, hidden, inter)?;
    Ok(QuantizeReport { modules: reports, bits_per_weight: all_bits / all_weights, out_dir: out_dir.to_path_buf() })
}

fn check_bits(what: &str, k: u32) -> Result<()> {
    if !(2..=4).contains(&k) {
        invalid!("quantize_model: {what}: {k} bits per weight; the kernels serve 2, 3 and 4");
    }
    Ok(())
}

/// Writes the artifact and the base model into `out_dir` (see the module documentation).
fn write_model_dir(
    gguf_path: &Path,
    out_dir: &Path,
    coded: &[(String, TrellisLinear)],
    hidden: usize,
    inter: usize,
) -> Result<()> {
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let tmp = out_dir.join(format!(".quantize-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    let result = (|| {
        let modules: Vec<(&str, &TrellisLinear)> = coded.iter().map(|(n, l)| (n.as_str(), l)).collect();
        let extra = [
            ("base_gguf", Value::from(BASE_GGUF)),
            ("model_type", Value::from("llama")),
            ("hidden_size", Value::from(hidden)),
            ("intermediate_size", Value::from(inter)),
        ];
        write_artifact(&tmp, &modules, &extra)?;
        place_base(gguf_path, &out_dir.join(BASE_GGUF), &tmp)?;
        let index = out_dir.join("model.safetensors.index.json");
        if index.exists() {
            std::fs::remove_file(&index).map_err(|e| Error::io(&index, e))?;
        }
        for name in ["model.safetensors", "config.json"] {
            let (from, to) = (tmp.join(name), out_dir.join(name));
            std::fs::rename(&from, &to).map_err(|e| Error::io(&to, e))?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Puts the source model at `target`: nothing to do where it already is that file, else a hard
/// link (or a copy) made in `tmp` and renamed over `target`.
fn place_base(source: &Path, target: &Path, tmp: &Path) -> Result<()> {
    let canonical = |p: &Path| std::fs::canonicalize(p).map_err(|e| Error::io(p, e));
    if target.exists() && canonical(source)? == canonical(target)? {
        return Ok(());
    }
    let staged = tmp.join(BASE_GGUF);
    if std::fs::hard_link(source, &staged).is_err() {
        std::fs::copy(source, &staged).map_err(|e| Error::io(&staged, e))?;
    }
    std::fs::rename(&staged, target).map_err(|e| Error::io(target, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_share_seeds_on_axis_1_only() {
        let s = |m: &str, a| rotation_seed(m, a, 7);
        assert_eq!(s("model.layers.2.mlp.gate_proj", 1), s("model.layers.2.mlp.up_proj", 1));
        assert_eq!(s("model.layers.2.self_attn.q_proj", 1), s("model.layers.2.self_attn.v_proj", 1));
        assert_ne!(s("model.layers.2.mlp.gate_proj", 0), s("model.layers.2.mlp.up_proj", 0));
        assert_ne!(s("model.layers.2.mlp.gate_proj", 1), s("model.layers.3.mlp.gate_proj", 1));
        assert_ne!(s("model.layers.2.mlp.gate_proj", 1), rotation_seed("model.layers.2.mlp.gate_proj", 1, 8));
    }
}
