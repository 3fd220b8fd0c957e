//! [`LlamaModel`]: a Llama-architecture decoder on MLX, loaded from a GGUF file (every linear
//! layer as shipped, or re-quantized as a [`LayerPlan`] says) or from a quantized model directory
//! whose trellis-coded modules replace the base GGUF's layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::io::gguf::Gguf;
use crate::nn::rms_norm;
use crate::nn::select::argmax;
use crate::ops::{dequantize, eval_all};
use crate::trellis::cuda::FoldCounters;
use crate::trellis::{Artifact, TrellisMlp};

use super::attention::{Attention, LayerCache};
use super::config::LlamaConfig;
use super::linear::Linear;
use super::mlp::Mlp;
use super::names::{gguf_tensor_name, hf_module, is_mlp, LINEARS};

/// How one linear layer is loaded from the GGUF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearPlan {
    /// As the file ships it (MLX affine for its quantized types).
    AsShipped,
    /// Dequantized to dense weights in the activation dtype.
    Dense,
    /// Dequantized, then re-quantized by MLX's affine quantization.
    Affine {
        /// Bits per weight (2 to 8).
        bits: i32,
        /// Inputs per scale and bias (32, 64 or 128).
        group_size: i32,
    },
}

/// What to make of each linear layer of a GGUF model, and the activation dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    /// For the MLP projections (gate, up, down).
    pub mlp: LinearPlan,
    /// For the attention projections (q, k, v, o).
    pub attention: LinearPlan,
    /// Per-module exceptions, by Hugging Face name (`model.layers.N.mlp.down_proj`).
    pub overrides: BTreeMap<String, LinearPlan>,
    /// The activation dtype (float32 or bfloat16; float16 also runs).
    pub dtype: Dtype,
}

impl Default for LayerPlan {
    fn default() -> Self {
        LayerPlan::shipped()
    }
}

impl LayerPlan {
    /// Every layer as shipped, float32 activations.
    pub fn shipped() -> LayerPlan {
        LayerPlan {
            mlp: LinearPlan::AsShipped,
            attention: LinearPlan::AsShipped,
            overrides: BTreeMap::new(),
            dtype: Dtype::Float32,
        }
    }

    /// The MLP projections re-quantized to `bits` in groups of `group_size`, the rest as shipped.
    pub fn mlp_affine(bits: i32, group_size: i32) -> LayerPlan {
        LayerPlan { mlp: LinearPlan::Affine { bits, group_size }, ..LayerPlan::shipped() }
    }

    /// Every linear layer re-quantized to `bits` in groups of `group_size`.
    pub fn all_affine(bits: i32, group_size: i32) -> LayerPlan {
        let p = LinearPlan::Affine { bits, group_size };
        LayerPlan { mlp: p, attention: p, ..LayerPlan::shipped() }
    }

    /// The plan of module `hf_name`.
    pub fn for_module(&self, hf_name: &str) -> LinearPlan {
        if let Some(p) = self.overrides.get(hf_name) {
            return *p;
        }
        if hf_name.contains(".mlp.") {
            self.mlp
        } else {
            self.attention
        }
    }
}

/// A callback that sees the input of each linear layer by Hugging Face module name
/// ([`LlamaModel::forward_observed`]); an error stops the forward pass.
pub type Observer<'a> = dyn FnMut(&str, &MlxArray) -> Result<()> + 'a;

/// The keys and values of every layer: what a decoder has already seen.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `layers` blocks.
    pub fn new(layers: usize) -> KvCache {
        KvCache { layers: vec![LayerCache::default(); layers] }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One decoder block.
#[derive(Debug, Clone)]
struct Block {
    attn_norm: MlxArray,
    attn: Attention,
    ffn_norm: MlxArray,
    mlp: Mlp,
}

/// The token embedding: dense rows, or MLX affine rows dequantized on lookup.
#[derive(Debug, Clone)]
struct Embedding(Linear);

impl Embedding {
    fn lookup(&self, ids: &MlxArray, dtype: Dtype) -> Result<MlxArray> {
        match &self.0 {
            Linear::Dense(table_t) => table_t.take(ids, 1)?.t(),
            Linear::Affine { weight, scales, biases, group_size, bits, .. } => {
                let rows = |a: &MlxArray| a.take(ids, 0);
                dequantize(&rows(weight)?, &rows(scales)?, &rows(biases)?, *group_size, *bits)?.astype(dtype)
            }
            Linear::Trellis(_) => invalid!("a trellis-coded embedding is not served"),
        }
    }
}

/// A Llama-architecture decoder: embedding, blocks, final norm and output layer (tied to the
/// embedding where the file has no `output.weight`).
#[derive(Debug, Clone)]
pub struct LlamaModel {
    config: LlamaConfig,
    embedding: Embedding,
    output: Linear,
    blocks: Vec<Block>,
    norm: MlxArray,
    dtype: Dtype,
    replaced: BTreeSet<String>,
}

/// A norm weight `[hidden]` in `dtype`.
fn norm_weight(gguf: &Gguf, name: &str, hidden: usize, dtype: Dtype) -> Result<MlxArray> {
    let w = gguf.dense_f32(name)?;
    if w.shape() != [hidden] {
        return Err(Error::artifact(
            gguf.path(),
            Some(name),
            format!("has shape {:?}, expected [{hidden}]", w.shape()),
        ));
    }
    w.astype(dtype)
}

impl LlamaModel {
    /// Loads a Llama GGUF file, each linear layer as `plan` says. Every weight is evaluated
    /// (read, converted, re-quantized) before this returns.
    pub fn from_gguf(path: impl AsRef<Path>, plan: &LayerPlan) -> Result<LlamaModel> {
        let path = path.as_ref();
        let gguf = Gguf::open(path)?;
        LlamaModel::from_opened_gguf(&gguf, plan).with_context(|| format!("loading the Llama model {}", path.display()))
    }

    /// [`LlamaModel::from_gguf`] of an opened file.
    pub fn from_opened_gguf(gguf: &Gguf, plan: &LayerPlan) -> Result<LlamaModel> {
        let dtype = plan.dtype;
        if !dtype.is_float() {
            invalid!("activations must be a floating dtype, got {dtype}");
        }
        let config = LlamaConfig::from_gguf(gguf)?;
        let mut replaced = BTreeSet::new();
        let mut blocks = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let mut linears = Vec::with_capacity(LINEARS.len());
            for linear in LINEARS {
                let hf = hf_module(i, linear);
                let name = gguf_tensor_name(&hf)?;
                let layer = match plan.for_module(&hf) {
                    LinearPlan::AsShipped => Linear::from_gguf(gguf.tensor(&name)?, dtype)?,
                    LinearPlan::Dense => Linear::dense(&gguf.dense_f32(&name)?, dtype)?,
                    LinearPlan::Affine { bits, group_size } => {
                        Linear::affine_from_dense(&gguf.dense_f32(&name)?, bits, group_size, dtype)
                            .with_context(|| format!("re-quantizing {name}"))?
                    }
                };
                if plan.for_module(&hf) != LinearPlan::AsShipped {
                    replaced.insert(hf);
                }
                linears.push(layer);
            }
            let [q, k, v, o, gate, up, down]: [Linear; 7] = linears.try_into().expect("seven linears");
            let attn = Attention::new(q, k, v, o, &config).with_context(|| format!("block {i}"))?;
            let mlp = Mlp::Linears { gate, up, down };
            check_mlp(&mlp, &config).with_context(|| format!("block {i}"))?;
            let attn_norm = norm_weight(gguf, &format!("blk.{i}.attn_norm.weight"), config.hidden, dtype)?;
            let ffn_norm = norm_weight(gguf, &format!("blk.{i}.ffn_norm.weight"), config.hidden, dtype)?;
            blocks.push(Block { attn_norm, attn, ffn_norm, mlp });
        }
        let embedding = Embedding(Linear::from_gguf(gguf.tensor("token_embd.weight")?, dtype)?);
        let output = if gguf.tensor_names().iter().any(|n| n == "output.weight") {
            Linear::from_gguf(gguf.tensor("output.weight")?, dtype)?
        } else {
            embedding.0.clone()
        };
        if output.shape() != [config.vocab, config.hidden] {
            invalid!("the output layer is {:?}, expected [{}, {}]", output.shape(), config.vocab, config.hidden);
        }
        let norm = norm_weight(gguf, "output_norm.weight", config.hidden, dtype)?;
        let model = LlamaModel { config, embedding, output, blocks, norm, dtype, replaced };
        model.eval_weights()?;
        Ok(model)
    }

    /// Loads a quantized model directory: `config.json` names the base GGUF file (key
    /// `"base_gguf"`, a file inside the directory) and lists trellis-coded modules (Hugging Face
    /// names) in its `quantization` entries, stored in the directory's safetensors. Each coded
    /// module replaces its layer of the base model (an MLP whose three projections are all coded
    /// becomes one [`TrellisMlp`]); every other layer is as the base file ships it.
    pub fn from_artifact(dir: impl AsRef<Path>, dtype: Dtype) -> Result<LlamaModel> {
        let dir = dir.as_ref();
        (|| {
            let artifact = Artifact::open(dir)?;
            let base = artifact.config_file("base_gguf")?;
            let mut model = LlamaModel::from_gguf(&base, &LayerPlan { dtype, ..LayerPlan::shipped() })?;
            let coded: BTreeSet<String> = artifact.trellis_modules()?.into_iter().collect();
            model.replace_coded(&artifact, &coded)?;
            Ok(model)
        })()
        .with_context(|| format!("loading the quantized model {}", dir.display()))
    }

    /// A copy of this model with the coded modules `modules` of `artifact` in place of its layers
    /// and every other layer as it is: what coding only those modules does to the model (a
    /// sensitivity measurement loads the base once and swaps one module at a time).
    pub fn with_coded(&self, artifact: &Artifact, modules: &BTreeSet<String>) -> Result<LlamaModel> {
        let mut model = self.clone();
        model.replace_coded(artifact, modules)?;
        Ok(model)
    }

    fn replace_coded(&mut self, artifact: &Artifact, coded: &BTreeSet<String>) -> Result<()> {
        let known: BTreeSet<String> = (0..self.config.layers).flat_map(|i| LINEARS.map(|l| hf_module(i, l))).collect();
        if let Some(unknown) = coded.difference(&known).next() {
            invalid!("coded module {unknown:?} is not a linear layer of this {}-block model", self.config.layers);
        }
        for (i, block) in self.blocks.iter_mut().enumerate() {
            let mlp_names = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"].map(|l| hf_module(i, l));
            let whole_mlp = mlp_names.iter().all(|n| coded.contains(n));
            if whole_mlp {
                let mlp = TrellisMlp::from_artifact(artifact, &format!("model.layers.{i}.mlp"))?;
                block.mlp = Mlp::Trellis(mlp);
                check_mlp(&block.mlp, &self.config).with_context(|| format!("block {i}"))?;
                self.replaced.extend(mlp_names);
            }
            for linear in LINEARS {
                let hf = hf_module(i, linear);
                // A wholly coded MLP is in place already; the attention's projections are not.
                if !coded.contains(&hf) || (whole_mlp && is_mlp(linear)) {
                    continue;
                }
                let layer = Linear::Trellis(artifact.module(&hf)?);
                let slot = match (linear, &mut block.mlp) {
                    ("self_attn.q_proj", _) => &mut block.attn.q,
                    ("self_attn.k_proj", _) => &mut block.attn.k,
                    ("self_attn.v_proj", _) => &mut block.attn.v,
                    ("self_attn.o_proj", _) => &mut block.attn.o,
                    ("mlp.gate_proj", Mlp::Linears { gate, .. }) => gate,
                    ("mlp.up_proj", Mlp::Linears { up, .. }) => up,
                    ("mlp.down_proj", Mlp::Linears { down, .. }) => down,
                    _ => unreachable!("a partly coded MLP keeps its three linears"),
                };
                if layer.shape() != slot.shape() {
                    invalid!(
                        "coded module {hf:?} is {:?}, the base model's layer is {:?}",
                        layer.shape(),
                        slot.shape()
                    );
                }
                *slot = layer;
                self.replaced.insert(hf);
            }
        }
        Ok(())
    }

    fn eval_weights(&self) -> Result<()> {
        let mut arrays: Vec<&MlxArray> = vec![&self.norm];
        for b in &self.blocks {
            arrays.extend([&b.attn_norm, &b.ffn_norm]);
            for l in [&b.attn.q, &b.attn.k, &b.attn.v, &b.attn.o] {
                arrays.extend(linear_arrays(l));
            }
            if let Mlp::Linears { gate, up, down } = &b.mlp {
                for l in [gate, up, down] {
                    arrays.extend(linear_arrays(l));
                }
            }
        }
        arrays.extend(linear_arrays(&self.embedding.0));
        arrays.extend(linear_arrays(&self.output));
        eval_all(&arrays)
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The activation dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config.layers)
    }

    /// The Hugging Face names of the linear layers that are not as the GGUF file ships them.
    pub fn replaced_modules(&self) -> &BTreeSet<String> {
        &self.replaced
    }

    /// Every linear layer of the blocks by Hugging Face name (coded MLPs by their three names).
    pub fn linear_bits(&self) -> BTreeMap<String, (u64, u64)> {
        let mut out = BTreeMap::new();
        for (i, b) in self.blocks.iter().enumerate() {
            for (l, layer) in LINEARS[..4].iter().zip([&b.attn.q, &b.attn.k, &b.attn.v, &b.attn.o]) {
                out.insert(hf_module(i, l), layer.stored_bits());
            }
            for (l, bits) in LINEARS[4..].iter().zip(b.mlp.stored_bits()) {
                out.insert(hf_module(i, l), bits);
            }
        }
        out
    }

    /// Stored bits per logical weight over the modules `select` picks (by Hugging Face name),
    /// scales and biases included; `None` where it picks none.
    pub fn bits_per_weight(&self, select: impl Fn(&str) -> bool) -> Option<f64> {
        let (bits, weights) = self
            .linear_bits()
            .into_iter()
            .filter(|(n, _)| select(n))
            .fold((0u64, 0u64), |(b, w), (_, (lb, lw))| (b + lb, w + lw));
        (weights > 0).then(|| bits as f64 / weights as f64)
    }

    /// The MLP half of block `block` on the residual stream `x` (`[.., hidden]` in the model's
    /// dtype): `x + mlp(rms_norm(x))`, as [`forward`](Self::forward) computes it. A benchmark
    /// chains the blocks' MLPs through it to time them the way the model runs them.
    pub fn mlp_residual(&self, block: usize, x: &MlxArray) -> Result<MlxArray> {
        let Some(b) = self.blocks.get(block) else {
            invalid!("block {block} of a model of {} blocks", self.blocks.len());
        };
        b.mlp.forward_residual(&rms_norm(x, &b.ffn_norm, self.config.rms_eps)?, x)
    }

    /// The logits (`[L, vocab]`, float32) of `tokens` following what `cache` holds; the tokens'
    /// keys and values are appended to `cache`.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<MlxArray> {
        self.run(tokens, cache, None)
    }

    /// [`LlamaModel::forward`], reporting the input of every linear layer to `observe` by Hugging
    /// Face module name as it is computed: q, k and v share one input, as do gate and up;
    /// `o_proj` sees the attention output and `down_proj` the SwiGLU output.
    pub fn forward_observed(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        observe: &mut Observer<'_>,
    ) -> Result<MlxArray> {
        self.run(tokens, cache, Some(observe))
    }

    /// The greedy choice after `logits` (a step's `[L, vocab]` logits, as
    /// [`forward`](Self::forward) returns them): the argmax of their last row, chosen on the
    /// device. A runner starts the step's logits and this token together
    /// ([`async_eval_all`](crate::async_eval_all) of [`DeviceToken::array`]), builds the next
    /// step from the token ([`forward_token`](Self::forward_token)) and only then reads it, as
    /// MLX's own generators do: the host's graph building overlaps the device's work.
    pub fn greedy_token(&self, logits: &MlxArray) -> Result<DeviceToken> {
        let vocab = self.config.vocab;
        let rows = match logits.shape()[..] {
            [rows, v] if rows > 0 && v == vocab => rows,
            ref s => invalid!("greedy_token: logits {s:?}, expected [L >= 1, {vocab}]"),
        };
        let last = logits.slice(&[rows as i32 - 1, 0], &[rows as i32, vocab as i32], &[1, 1])?;
        Ok(DeviceToken(argmax(&last, -1, false)?.astype(Dtype::Uint32)?.reshape(&[1])?))
    }

    /// The logits (`[1, vocab]`, float32) of one token chosen on the device, following what
    /// `cache` holds; its key and value are appended to `cache`.
    pub fn forward_token(&self, token: &DeviceToken, cache: &mut KvCache) -> Result<MlxArray> {
        self.check_cache(cache, 1)?;
        self.run_ids(&token.0, 1, cache, None)
    }

    /// Refuses a cache of another model or without room for `new` positions.
    fn check_cache(&self, cache: &KvCache, new: usize) -> Result<()> {
        let c = &self.config;
        if cache.layers.len() != c.layers {
            invalid!("the cache has {} layers, the model {}", cache.layers.len(), c.layers);
        }
        if cache.len() + new > c.context {
            invalid!("{} cached and {new} new positions exceed the context of {}", cache.len(), c.context);
        }
        Ok(())
    }

    fn run(&self, tokens: &[u32], cache: &mut KvCache, observe: Option<&mut Observer<'_>>) -> Result<MlxArray> {
        let c = &self.config;
        if tokens.is_empty() {
            invalid!("forward needs at least one token");
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            invalid!("token id {bad} is outside the vocabulary of {}", c.vocab);
        }
        self.check_cache(cache, tokens.len())?;
        let l = tokens.len();
        let ids = MlxArray::from_slice(tokens, &[l])?;
        self.run_ids(&ids, l, cache, observe)
    }

    /// The forward pass of `l` token ids in vocabulary range (checked by the callers) after a
    /// checked cache.
    fn run_ids(
        &self,
        ids: &MlxArray,
        l: usize,
        cache: &mut KvCache,
        mut observe: Option<&mut Observer<'_>>,
    ) -> Result<MlxArray> {
        let c = &self.config;
        let mut x = self.embedding.lookup(ids, self.dtype)?.reshape(&[1, l, c.hidden])?;
        // An observer sees the down projection's input, so the MLP is then run in two parts.
        let observing = observe.is_some();
        // On CUDA one fill zeroes the fold counters of every fed launch of the pass (each block's
        // coded attention and, joined, its MLP's gate·up): no pre-pass launch for any of them,
        // and one fill for the whole pass, not one a block.
        let fed_counts: Vec<(Option<usize>, Option<usize>)> = self
            .blocks
            .iter()
            .map(|b| (b.attn.fed_counters(l, self.dtype), b.mlp.fed_counters(l, self.dtype).filter(|_| !observing)))
            .collect();
        let total = fed_counts
            .iter()
            .try_fold(0usize, |sum, &(a, m)| sum.checked_add(a.unwrap_or(0))?.checked_add(m.unwrap_or(0)));
        let Some(total) = total else {
            invalid!("the fold counters of a pass of {} blocks overflow", self.blocks.len());
        };
        let mut fed = (total > 0).then(|| FoldCounters::zeroed(total)).transpose()?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate() {
            let mut report = |name: &str, a: &MlxArray| -> Result<()> {
                match observe.as_mut() {
                    Some(f) => f(&hf_module(i, name), a),
                    None => Ok(()),
                }
            };
            let (attn_fed, mlp_fed) = fed_counts[i];
            let h = rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            x = match (attn_fed, fed.as_mut()) {
                (Some(_), Some(counters)) => {
                    block.attn.forward_residual_fed(&h, &x, layer_cache, &mut report, counters)?
                }
                _ => block.attn.forward_residual(&h, &x, layer_cache, &mut report)?,
            };
            let h = rms_norm(&x, &block.ffn_norm, c.rms_eps)?;
            if let (Some(_), Some(counters)) = (mlp_fed, fed.as_mut()) {
                x = block.mlp.forward_residual_fed(&h, &x, counters)?;
            } else if observing {
                report("mlp.gate_proj", &h)?;
                report("mlp.up_proj", &h)?;
                let s = block.mlp.swiglu(&h)?;
                report("mlp.down_proj", &s)?;
                x = x.add(&block.mlp.down(&s)?)?;
            } else {
                x = block.mlp.forward_residual(&h, &x)?;
            }
        }
        let h = rms_norm(&x, &self.norm, c.rms_eps)?;
        self.output.forward(&h)?.reshape(&[l, c.vocab])?.astype(Dtype::Float32)
    }
}

/// A token id chosen on the device ([`LlamaModel::greedy_token`]): a lazy uint32 `[1]` array,
/// inside the vocabulary by construction, so a step can be built from it before the host reads it.
#[derive(Clone)]
pub struct DeviceToken(MlxArray);

impl DeviceToken {
    /// The id as a (lazy) uint32 `[1]` array, to evaluate beside the step that made it.
    pub fn array(&self) -> &MlxArray {
        &self.0
    }

    /// The id, read on the host (waits for the step that chooses it).
    pub fn read(&self) -> Result<u32> {
        Ok(self.0.to_vec::<u32>()?[0])
    }
}

/// The arrays of a non-trellis linear layer (for evaluating weights at load).
fn linear_arrays(l: &Linear) -> Vec<&MlxArray> {
    match l {
        Linear::Dense(w) => vec![w],
        Linear::Affine { weight, scales, biases, .. } => vec![weight, scales, biases],
        Linear::Trellis(_) => vec![],
    }
}

fn check_mlp(mlp: &Mlp, c: &LlamaConfig) -> Result<()> {
    let shapes = match mlp {
        Mlp::Linears { gate, up, down } => [gate.shape(), up.shape(), down.shape()],
        Mlp::Trellis(m) => [m.gate(), m.up(), m.down()].map(|t| Linear::Trellis(t.clone()).shape()),
    };
    let want = [[c.intermediate, c.hidden], [c.intermediate, c.hidden], [c.hidden, c.intermediate]];
    if shapes != want {
        invalid!("the MLP's gate, up and down are {shapes:?}, the config needs {want:?}");
    }
    Ok(())
}
