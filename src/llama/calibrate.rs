//! Calibration: the second moment `H = Σ xᵀx` of the input of every linear layer of a Llama
//! model, collected over a calibration text, for the Hessian-weighted encoder
//! ([`encode_linear_ldlq`](crate::trellis::encoder::encode_linear_ldlq)) and the proxy error
//! `tr(E H Eᵀ)`.
//!
//! # What is collected
//!
//! Layers that share an input share one `H` ([`input_key`]): q, k and v
//! (`model.layers.N.self_attn.input`), gate and up (`model.layers.N.mlp.input`); `o_proj` sees
//! the attention output (`model.layers.N.self_attn.o_proj.input`) and `down_proj` the SwiGLU
//! output (`model.layers.N.mlp.down_proj.input`). The model runs [`LlamaModel::forward_observed`]
//! on non-overlapping windows of the tokenized text, each from an empty cache (as the evaluation
//! scores them); for every observed input `x` (`[L, n]`) the window's `xᵀx` is formed on MLX in
//! float32 by one matrix product and added on the host in f64. The logits are never evaluated,
//! and blocks past the last one asked for are never computed.
//!
//! The model should be the one as shipped: `H` describes the inputs the layers see in the model
//! the codes replace layers of.
//!
//! # Bases
//!
//! `H` is kept in the basis of the dense weights. A layer whose input axis is rotated before
//! coding (`W' = W Q`, axis 1) needs `Qᵀ H Q` ([`rotate_hessian`]); a layer rotated on its output
//! axis (axis 0) keeps `H` as it is.
//!
//! # Files
//!
//! [`Hessians::save`] writes a safetensors file of f64 `[n, n]` tensors named by input key, its
//! metadata holding the token and window counts and the texts; [`Hessians::load`] reads one back,
//! checking every tensor's dtype, shape and finiteness.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Error, Result};
use crate::ops::eval_all;
use crate::trellis::rotation::Rotation;

use crate::io::gguf::Gguf;

use super::model::{LayerPlan, LinearPlan, LlamaModel};
use super::names::{hf_module, LINEARS};
use super::tokenizer::LlamaTokenizer;

/// The default calibration texts: license texts every Debian machine has, none of them the
/// default evaluation text (`GPL-3`).
pub const DEFAULT_CALIBRATION_TEXTS: [&str; 4] = [
    "/usr/share/common-licenses/GPL-2",
    "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/GFDL-1.3",
];

/// The default number of calibration tokens.
pub const DEFAULT_CALIBRATION_TOKENS: usize = 16_384;

/// The default calibration window, in tokens.
pub const DEFAULT_CALIBRATION_WINDOW: usize = 512;

/// The key of the input of linear `module` (a Hugging Face name, `model.layers.N.mlp.up_proj`):
/// layers that share an input share a key (see the [module](self) docs).
pub fn input_key(module: &str) -> Result<String> {
    let Some((prefix, linear)) = module.rsplit_once('.') else {
        invalid!("{module:?} is not a Llama linear layer name (model.layers.N.mlp.up_proj, ...)");
    };
    Ok(match linear {
        "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj" => format!("{prefix}.input"),
        "o_proj" | "down_proj" => format!("{module}.input"),
        _ => invalid!("{module:?} is not a Llama linear layer name (model.layers.N.mlp.up_proj, ...)"),
    })
}

/// Which inputs [`collect_hessians`] accumulates, and over what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalibrationSpec {
    /// Tokens per window (each window runs from an empty cache); at least 2.
    pub window: usize,
    /// Only the first this many blocks (`None`: every block).
    pub layers: Option<usize>,
    /// Also the attention's inputs (q/k/v and o), not only the MLP's.
    pub attention: bool,
}

impl Default for CalibrationSpec {
    /// Windows of [`DEFAULT_CALIBRATION_WINDOW`], every block, MLP and attention inputs.
    fn default() -> CalibrationSpec {
        CalibrationSpec { window: DEFAULT_CALIBRATION_WINDOW, layers: None, attention: true }
    }
}

/// One accumulated second moment: `n × n`, f64, row-major, symmetric.
#[derive(Debug, Clone, PartialEq)]
pub struct Hessian {
    /// The input width.
    pub n: usize,
    /// `Σ xᵀx`, row-major.
    pub data: Vec<f64>,
}

/// The second moments of a model's layer inputs by input key ([`input_key`]), and what they were
/// collected over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hessians {
    /// By input key.
    pub by_input: BTreeMap<String, Hessian>,
    /// Tokens the forward passes saw (each contributes one row `x` to every `H`).
    pub tokens: usize,
    /// Windows run.
    pub windows: usize,
    /// Where the tokens came from (file names, for the record).
    pub source: String,
    /// Seconds spent collecting (0 for loaded ones).
    pub seconds: f64,
}

impl Hessians {
    /// The `H` of the input of linear `module` (Hugging Face name), in the dense weights' basis.
    pub fn for_module(&self, module: &str) -> Option<&Hessian> {
        self.by_input.get(&input_key(module).ok()?)
    }

    /// Host bytes held by the matrices.
    pub fn bytes(&self) -> usize {
        self.by_input.values().map(|h| h.data.len() * 8).sum()
    }

    /// Writes the matrices to the safetensors file `path` (f64 `[n, n]` tensors by input key;
    /// metadata `tokens`, `windows` and `source`).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes: Vec<(String, Vec<u8>, usize)> = self
            .by_input
            .iter()
            .map(|(k, h)| (k.clone(), h.data.iter().flat_map(|v| v.to_le_bytes()).collect(), h.n))
            .collect();
        let views = bytes
            .iter()
            .map(|(k, b, n)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![*n, *n], b).map(|v| (k.as_str(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::artifact(path, None, format!("building the Hessian tensors: {e}")))?;
        let metadata = [
            ("tokens".to_string(), self.tokens.to_string()),
            ("windows".to_string(), self.windows.to_string()),
            ("source".to_string(), self.source.clone()),
        ]
        .into_iter()
        .collect();
        let data = safetensors::serialize(views, Some(metadata))
            .map_err(|e| Error::artifact(path, None, format!("serializing the Hessians: {e}")))?;
        std::fs::write(path, data).map_err(|e| Error::io(path, e))
    }

    /// Reads a file [`Hessians::save`] wrote: every tensor must be f64 `[n, n]` with finite
    /// entries, named like an input key.
    pub fn load(path: impl AsRef<Path>) -> Result<Hessians> {
        let path = path.as_ref();
        let bad = |message: String| Error::artifact(path, None, message);
        let buffer = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let file =
            safetensors::SafeTensors::deserialize(&buffer).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&buffer)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let meta = |key: &str| header.metadata().as_ref().and_then(|m| m.get(key)).cloned();
        let count = |key: &str| -> Result<usize> {
            meta(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("metadata {key:?} is missing or not a count")))
        };
        let mut out = Hessians {
            tokens: count("tokens")?,
            windows: count("windows")?,
            source: meta("source").unwrap_or_default(),
            ..Hessians::default()
        };
        for (name, view) in file.tensors() {
            let tensor = |message: String| Error::artifact(path, Some(&name), message);
            if !name.starts_with("model.layers.") || !name.ends_with(".input") {
                return Err(tensor("is not the name of a layer input (model.layers.N....input)".into()));
            }
            let n = match view.shape() {
                [a, b] if a == b && *a > 0 => *a,
                s => return Err(tensor(format!("has shape {s:?}, expected a square [n, n]"))),
            };
            if view.dtype() != safetensors::Dtype::F64 {
                return Err(tensor(format!("is {:?}, expected F64", view.dtype())));
            }
            let data: Vec<f64> =
                view.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
            if let Some(i) = data.iter().position(|v| !v.is_finite()) {
                return Err(tensor(format!("entry [{}, {}] is {} (not finite)", i / n, i % n, data[i])));
            }
            out.by_input.insert(name, Hessian { n, data });
        }
        Ok(out)
    }
}

/// The calibration tokens: the files `texts` read, concatenated (a blank line between two),
/// tokenized whole and cut to the first `max_tokens` (0: all). Errors on an unreadable file or
/// an empty result.
pub fn calibration_tokens(tokenizer: &LlamaTokenizer, texts: &[PathBuf], max_tokens: usize) -> Result<Vec<u32>> {
    let mut text = String::new();
    for path in texts {
        let part = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&part);
    }
    let mut tokens = tokenizer.encode(&text)?;
    if max_tokens > 0 {
        tokens.truncate(max_tokens);
    }
    if tokens.is_empty() {
        invalid!("calibration: the texts {texts:?} give no tokens");
    }
    Ok(tokens)
}

/// Collects `H = Σ xᵀx` of the inputs `spec` asks for by running `model` on `tokens` in windows
/// (see the [module](self) docs). `progress(windows_done, windows)` is called after each window.
pub fn collect_hessians(
    model: &LlamaModel,
    tokens: &[u32],
    spec: &CalibrationSpec,
    source: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Hessians> {
    let start = Instant::now();
    if spec.window < 2 {
        invalid!("calibration: windows of {} tokens; at least 2", spec.window);
    }
    let blocks = model.config().layers;
    let layers = match spec.layers {
        Some(n) if n > blocks => invalid!("calibration: {n} blocks asked for, the model has {blocks}"),
        Some(n) => n,
        None => blocks,
    };
    // The one module of each shared input that is observed (the others see the same array).
    let observed: BTreeSet<String> = (0..layers)
        .flat_map(|i| {
            LINEARS
                .iter()
                .filter(|l| matches!(**l, "mlp.gate_proj" | "mlp.down_proj"))
                .chain(
                    LINEARS.iter().filter(|l| spec.attention && matches!(**l, "self_attn.q_proj" | "self_attn.o_proj")),
                )
                .map(move |l| hf_module(i, l))
        })
        .collect();
    let windows: Vec<&[u32]> = tokens.chunks(spec.window).collect();
    if windows.is_empty() {
        invalid!("calibration: no tokens");
    }
    let mut out = Hessians { source: source.to_string(), ..Hessians::default() };
    for (w, window) in windows.iter().enumerate() {
        let l = window.len();
        let mut products: Vec<(String, usize, MlxArray)> = Vec::with_capacity(observed.len());
        let mut observe = |module: &str, x: &MlxArray| -> Result<()> {
            if !observed.contains(module) {
                return Ok(());
            }
            let n = *x.shape().last().unwrap_or(&0);
            let x = x.reshape(&[l, n])?.astype(Dtype::Float32)?;
            products.push((input_key(module)?, n, x.t()?.matmul(&x)?));
            Ok(())
        };
        let mut cache = model.new_cache();
        // The logits are left unevaluated: only the observed products are computed.
        let _logits = model.forward_observed(window, &mut cache, &mut observe)?;
        let arrays: Vec<&MlxArray> = products.iter().map(|(_, _, a)| a).collect();
        eval_all(&arrays)?;
        for (key, n, product) in &products {
            let values = product.to_vec::<f32>()?;
            let h = out.by_input.entry(key.clone()).or_insert_with(|| Hessian { n: *n, data: vec![0f64; n * n] });
            if h.n != *n || values.len() != n * n {
                invalid!("calibration: the input {key} is {n} wide in one window and {} in another", h.n);
            }
            h.data.iter_mut().zip(&values).for_each(|(a, &v)| *a += f64::from(v));
        }
        out.tokens += l;
        out.windows += 1;
        progress(w + 1, windows.len());
    }
    if let Some((key, _)) = out.by_input.iter().find(|(_, h)| h.data.iter().any(|v| !v.is_finite())) {
        invalid!("calibration: the second moment of {key} has a non-finite entry (the activations overflowed)");
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Calibrates the GGUF model `gguf_path` as shipped: its tokenizer reads `texts`
/// ([`calibration_tokens`], at most `max_tokens`), the model loads with the shipped weights of
/// every linear layer dequantized to dense float32 ([`LinearPlan::Dense`]: the same weights; MLX
/// multiplies dense matrices far faster than quantized ones on the CPU) and float32 activations,
/// and [`collect_hessians`] runs over the tokens.
pub fn calibrate_gguf(
    gguf_path: impl AsRef<Path>,
    texts: &[PathBuf],
    max_tokens: usize,
    spec: &CalibrationSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Hessians> {
    let path = gguf_path.as_ref();
    let gguf = Gguf::open(path)?;
    let tokenizer = LlamaTokenizer::from_gguf(&gguf)?;
    let tokens = calibration_tokens(&tokenizer, texts, max_tokens)?;
    let plan = LayerPlan { mlp: LinearPlan::Dense, attention: LinearPlan::Dense, ..LayerPlan::shipped() };
    let model = LlamaModel::from_opened_gguf(&gguf, &plan)?;
    let names: Vec<String> = texts
        .iter()
        .map(|p| p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned()))
        .collect();
    collect_hessians(&model, &tokens, spec, &names.join(" + "), progress)
}

/// `Qᵀ H Q` for the rotation `Q` of an input axis of `n = rotation.len()` entries (see
/// [`Rotation`]): the second moment of the rotated inputs `x' = x Q`. Computed as two passes of
/// the fast transform (`M = H Q` row by row, then `(Mᵀ Q)ᵀ`), in f64, `O(n² log b)`.
pub fn rotate_hessian(h: &[f64], rotation: &Rotation) -> Result<Vec<f64>> {
    let n = rotation.len();
    if n.checked_mul(n) != Some(h.len()) {
        invalid!("rotate_hessian: H has {} values, the rotation is of {n} entries", h.len());
    }
    let mut m = h.to_vec();
    rotation.rotate_f64(&mut m)?;
    let mut t: Vec<f64> = (0..n * n).map(|i| m[(i % n) * n + i / n]).collect();
    rotation.rotate_f64(&mut t)?;
    // Qᵀ H Q is symmetric; transposing back keeps the rounding of the two passes as they fell.
    Ok((0..n * n).map(|i| t[(i % n) * n + i / n]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_inputs_share_keys() {
        let k = |m: &str| input_key(m).unwrap();
        assert_eq!(k("model.layers.3.mlp.gate_proj"), k("model.layers.3.mlp.up_proj"));
        assert_eq!(k("model.layers.3.self_attn.q_proj"), k("model.layers.3.self_attn.v_proj"));
        assert_ne!(k("model.layers.3.mlp.down_proj"), k("model.layers.3.mlp.up_proj"));
        assert_ne!(k("model.layers.3.self_attn.o_proj"), k("model.layers.3.self_attn.q_proj"));
        assert_ne!(k("model.layers.3.mlp.up_proj"), k("model.layers.4.mlp.up_proj"));
        assert!(input_key("model.layers.3.mlp.fc1").is_err());
        assert!(input_key("nothing").is_err());
    }
}
