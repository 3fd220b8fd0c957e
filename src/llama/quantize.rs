//! Whole-model quantization: the linear projections of a Llama-architecture GGUF model coded
//! into a trellis artifact that the model runner loads.
//!
//! [`quantize_model`] reads each chosen projection of every block dequantized to f32, codes it
//! as [`code_projection`](super::coding::code_projection) does (the coded axis chosen by the rule
//! of docs/format.md §10, rotated by default, padded where neither dimension is a whole number of
//! 256-weight blocks; unweighted, or Hessian-weighted by LDLQ against the calibration `H` of its
//! input), and writes to the output directory:
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
//! [`quantize_model_allocations`] writes several such directories from one coding run: each
//! projection is coded once at every k the outputs need, and each output ([`Allocation`]: a
//! budget, or one k for every projection) picks its codes from those.
//!
//! The projections are read a window at a time (at most 2²⁷ dense weights; SmolLM2's fit one)
//! and the window's projections at one k are coded together by [`code_projections`]: the
//! Hessian-weighted ones run their feedback steps in lockstep, one search call per step for all
//! of them (the codes are those of coding each alone).
//!
//! Rotation seeds: a projection stored `[out, in]` (axis 1) takes the seed of its input (every
//! axis-1 projection of one input shares one rotation, so a runner can rotate that input once:
//! q/k/v share `model.layers.N.self_attn.input`, gate/up `model.layers.N.mlp.input`); any other
//! takes its own name's. The seed of a key is its 64-bit FNV-1a hash xor [`QuantizeSpec::seed`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use crate::dtype::Dtype;
use crate::error::{invalid, Error, ErrorContext, Result};
use crate::io::gguf::Gguf;
use crate::trellis::encoder::allocate::{allocate_bits, BitCandidate, TensorOptions};
use crate::trellis::encoder::{
    choose_axis, fitting_block_len, CodedLinear, EncoderBackend, EncoderConfig, LdlqConfig, LdlqOutcome, ProxyError,
    BLOCK_LEN,
};
use crate::trellis::{write_artifact, TrellisLinear};

use super::calibrate::Hessians;
use super::coding::{code_projections, ProjectionCoding, ProjectionJob};
use super::names::{gguf_tensor_name, hf_module, is_mlp, split_module, LINEARS};

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

/// The bits per weight a budget chooses from, for every coded projection.
pub const BUDGET_BITS: [u32; 3] = [2, 3, 4];

/// What [`quantize_model`] (and [`quantize_model_allocations`]) codes, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeSpec {
    /// Bits per weight (2, 3 or 4) of every coded projection without an override (ignored with
    /// a [`budget`](Self::budget)).
    pub bits: u32,
    /// Bits per weight of projections by Hugging Face module name (`model.layers.3.mlp.down_proj`)
    /// or by a suffix of one that starts after a dot (`self_attn.v_proj`, `v_proj`: that
    /// projection of every block). A module takes its full name's k, else its longest matching
    /// suffix's; every key must match a coded projection.
    pub bits_overrides: BTreeMap<String, u32>,
    /// Code the attention projections (q, k, v, o) too, not only the MLP's.
    pub attention: bool,
    /// Bits per weight of every coded attention projection without an override (`None`: as
    /// [`bits`](Self::bits)); with `attention` only, and refused beside a budget as overrides
    /// are. SmolLM2's attention is more sensitive than its MLP: k 4 there beside k 3 MLPs
    /// brings the whole model below MLX's 4-bit in KL and perplexity (docs/real-models.md).
    pub attention_bits: Option<u32>,
    /// Code a projection that has no axis of whole 256-weight blocks in shorter blocks that
    /// divide one ([`fitting_block_len`]: SmolLM2's 576- and 192-wide attention in blocks of
    /// 192) instead of padding it to whole 256-weight blocks, which stores a third more bits
    /// there. Along the outputs (axis 0) the GPUs' down kernels serve blocks of a multiple of
    /// 64 (192 among them); along the inputs only the host path (CPU) and the generic path do.
    /// On an attention coded along its inputs LDLQ gains less than
    /// on the padded one (the padding left its last input block slack); along its outputs
    /// ([`attention_axis`](Self::attention_axis) 0) it gains more (docs/real-models.md).
    pub fit_blocks: bool,
    /// The axis the attention projections are coded along where it is a whole number of blocks
    /// (`None`: 1, along their inputs, the conventional axis; 0: along their outputs, which LDLQ
    /// codes with feedback after every input feature instead of every input block).
    pub attention_axis: Option<u32>,
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
    /// Code every projection Hessian-weighted (LDLQ) against the calibration `H` of its input,
    /// with these parameters; `None` codes unweighted.
    pub ldlq: Option<LdlqConfig>,
    /// With `ldlq`: also code every projection unweighted and report that code's proxy error
    /// beside the weighted one's (twice the coding work).
    pub baseline: bool,
    /// After coding, set each stored row's scale so that the row decodes with the dense row's
    /// norm ([`match_row_norms`](crate::trellis::encoder::match_row_norms)); no bits more. On
    /// SmolLM2 coded whole at k 3 it lowered the KL against the shipped model by 5 % and the
    /// perplexity by 3 % on the first 1,024 tokens of GPL-3 (docs/real-models.md).
    pub match_norms: bool,
    /// Pick each projection's bits per weight from [`BUDGET_BITS`] so that all coded projections
    /// together store at most this many bits per weight (codes, scales and rotation signs), by
    /// [`allocate_bits`] on the measured proxy errors. Needs a calibration `H` of every coded
    /// projection's input; excludes `bits_overrides`.
    pub budget: Option<f64>,
}

impl Default for QuantizeSpec {
    /// k 4 MLPs, rotated, unweighted, L 12, seed 0, one thread per core, the search where it runs
    /// best.
    fn default() -> QuantizeSpec {
        QuantizeSpec {
            bits: 4,
            bits_overrides: BTreeMap::new(),
            attention: false,
            attention_bits: None,
            fit_blocks: false,
            attention_axis: None,
            layers: None,
            rotation: true,
            seed: 0,
            l: 12,
            threads: None,
            backend: EncoderBackend::Auto,
            ldlq: None,
            baseline: false,
            match_norms: false,
            budget: None,
        }
    }
}

/// One candidate of a budget: a projection coded at `k`.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateReport {
    /// Bits per coded weight.
    pub k: u32,
    /// Stored bits (codes, scales, signs) over the logical weights.
    pub bits_per_weight: f64,
    /// The proxy error `tr(E H Eᵀ)` and its reference `tr(W H Wᵀ)`.
    pub proxy: ProxyError,
    /// The proxy error of the unweighted code at this `k`, where it was coded too.
    pub baseline_proxy: Option<ProxyError>,
    /// How LDLQ went at this `k`, where it was asked for and applicable.
    pub ldlq: Option<LdlqOutcome>,
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
    /// The block length `T` in weights.
    pub block_len: u32,
    /// Bits per weight.
    pub bits: u32,
    /// The rotation block, if rotated.
    pub rotation_block: Option<usize>,
    /// `mse / mean w²` of the decoded weights against the dense ones.
    pub relative_mse: f64,
    /// Stored bits (codes, scales, signs) over the logical weights.
    pub bits_per_weight: f64,
    /// The proxy error of the code, where a calibration `H` of its input is known.
    pub proxy: Option<ProxyError>,
    /// The proxy error of the unweighted code, where it was coded beside an LDLQ one
    /// ([`QuantizeSpec::baseline`]).
    pub baseline_proxy: Option<ProxyError>,
    /// How LDLQ went, where it was asked for and applicable.
    pub ldlq: Option<LdlqOutcome>,
    /// Why the code is not what was asked for (no `H`, padding, LDLQ fallbacks).
    pub warnings: Vec<String>,
    /// With a budget: every candidate, by growing `k`; in the final report only.
    pub candidates: Vec<CandidateReport>,
    /// True for a code reported as it is coded where the projection is coded at several k (a
    /// budget's candidates, or the k's of several outputs): the choice comes later, in the final
    /// [`QuantizeReport`]s.
    pub candidate: bool,
    /// Seconds spent coding it (every candidate, with a budget; its k alone, in a uniform output
    /// of a run that coded several). Projections coded together (a window's projections at one
    /// k) share their run's time evenly; the time of reading it counts where all its k's do.
    pub seconds: f64,
}

/// What [`quantize_model`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Every coded projection, in order, as written.
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

/// A projection's code at one k: its report as coded (`.0`), the code (`.1`) and the code's stored
/// bits (`.2`).
type CodedAt = (ModuleReport, CodedLinear, u64);

/// Stored bits of a coded layer (codes, f16 scales, f16 rotation signs) and its logical weights.
fn stored_bits(coded: &CodedLinear, shape: [usize; 2]) -> (u64, u64) {
    let g = &coded.layer.geometry;
    let signs = coded.coded_axis.rotation.as_ref().map_or(0, |r| r.len());
    let bits = (g.code_words() * 32 + g.rows * 16 + signs * 16) as u64;
    (bits, (shape[0] * shape[1]) as u64)
}

/// What [`quantize_model`] and [`quantize_model_allocations`] report while they work.
#[derive(Debug, Clone, Copy)]
pub enum QuantizeProgress<'a> {
    /// Blocks coded so far by the run that codes `projections` projections at `k` together
    /// (their Hessian-weighted feedback steps in lockstep): `done` of `total`.
    Blocks {
        /// The bit width being coded.
        k: u32,
        /// Projections in the run.
        projections: usize,
        /// Blocks coded so far.
        done: usize,
        /// Blocks the run codes.
        total: usize,
    },
    /// A projection coded at one k.
    Coded(&'a ModuleReport),
}

/// How one output of [`quantize_model_allocations`] picks each coded projection's bits per weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allocation {
    /// At most this many stored bits per weight (codes, scales and rotation signs) over all coded
    /// projections together, each projection's k picked from [`BUDGET_BITS`] by [`allocate_bits`]
    /// on the measured proxy errors, as [`QuantizeSpec::budget`] does; needs a calibration `H` of
    /// every coded projection's input and excludes bits overrides.
    Budget(f64),
    /// Every coded projection at this k (2, 3 or 4), but those named in
    /// [`QuantizeSpec::bits_overrides`], as [`QuantizeSpec::bits`] does.
    Uniform(u32),
}

/// Codes the projections of the GGUF model `gguf_path` by `spec` into `out_dir` (see the module
/// documentation), weighting and measuring codes by `hessians` (the calibration of the model's
/// layer inputs, [`collect_hessians`](super::calibrate::collect_hessians)) where given, calling
/// `progress` with each coding run's blocks as they are coded and with each projection (each
/// budget candidate) once it is coded (after the run that codes its window at that k, in the
/// order of the projections; see [`QuantizeProgress`]). The output directory is
/// created if needed; files other than the ones written (and a stale shard index) are left alone.
pub fn quantize_model(
    gguf_path: impl AsRef<Path>,
    spec: &QuantizeSpec,
    hessians: Option<&Hessians>,
    out_dir: impl AsRef<Path>,
    progress: &mut dyn FnMut(QuantizeProgress<'_>),
) -> Result<QuantizeReport> {
    // spec.bits is checked even where a budget makes it unused, as it always was.
    check_bits("bits", spec.bits)?;
    let allocation = spec.budget.map_or(Allocation::Uniform(spec.bits), Allocation::Budget);
    let mut reports =
        quantize_outputs(gguf_path.as_ref(), spec, hessians, &[(allocation, out_dir.as_ref())], progress)?;
    reports.pop().ok_or_else(|| Error::invalid("quantize_model: no report of the output"))
}

/// Codes the projections of the GGUF model `gguf_path` once and writes several artifact
/// directories from those codes, one per output, each as [`quantize_model`] writes one: every
/// projection is coded at every k some output needs (all of [`BUDGET_BITS`] where an output is
/// a budget, else the outputs' uniform k's and the overrides), then each output picks one k per
/// projection by its [`Allocation`]. The encoder is deterministic, so each directory holds the
/// codes that a [`quantize_model`] run of the same spec and allocation writes.
///
/// `spec.bits` is not read (the outputs say the bits) and `spec.budget` must be `None`;
/// `spec.bits_overrides` apply to uniform outputs and are refused beside a budget. Every budget
/// is checked against the least the projections store before anything is coded; the output
/// directories must be distinct. `progress` follows each coding run's blocks and sees each
/// projection once it is coded at each k (marked [`candidate`](ModuleReport::candidate) where
/// it is coded at several). Returns one
/// report per output, in the order of `outputs`.
pub fn quantize_model_allocations(
    gguf_path: impl AsRef<Path>,
    spec: &QuantizeSpec,
    hessians: Option<&Hessians>,
    outputs: &[(Allocation, PathBuf)],
    progress: &mut dyn FnMut(QuantizeProgress<'_>),
) -> Result<Vec<QuantizeReport>> {
    if let Some(b) = spec.budget {
        invalid!("quantize_model_allocations: the spec's budget {b} is not read here; give it as an output's Allocation::Budget");
    }
    let outputs: Vec<(Allocation, &Path)> = outputs.iter().map(|(a, dir)| (*a, dir.as_path())).collect();
    quantize_outputs(gguf_path.as_ref(), spec, hessians, &outputs, progress)
}

/// The k of a projection in a uniform output of `k`: its override, else the attention's k for
/// an attention projection where one is set, else `k`.
fn uniform_k(spec: &QuantizeSpec, module: &str, k: u32) -> u32 {
    let attention = spec.attention_bits.filter(|_| split_module(module).is_some_and(|(_, linear)| !is_mlp(linear)));
    bits_override(spec, module).or(attention).unwrap_or(k)
}

/// The k `spec.bits_overrides` gives `module`: its full name's, else its longest matching
/// suffix's (one that starts after a dot).
fn bits_override(spec: &QuantizeSpec, module: &str) -> Option<u32> {
    spec.bits_overrides
        .iter()
        .filter(|(key, _)| override_matches(key, module))
        .max_by_key(|(key, _)| key.len())
        .map(|(_, &k)| k)
}

/// Whether the override `key` names `module`: the full name, or a suffix after a dot.
fn override_matches(key: &str, module: &str) -> bool {
    !key.is_empty() && module.strip_suffix(key).is_some_and(|head| head.is_empty() || head.ends_with('.'))
}

/// `dir` made absolute, `.` and `..` resolved and every existing prefix's links followed, so that
/// two spellings of one directory compare equal even before it exists.
fn dir_identity(dir: &Path) -> Result<PathBuf> {
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| Error::io(dir, e))?.join(dir)
    };
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::CurDir => {}
            // After canonicalization an existing prefix holds no links, so popping is exact.
            Component::ParentDir => {
                out.pop();
            }
            other => {
                out.push(other);
                if let Ok(real) = std::fs::canonicalize(&out) {
                    out = real;
                }
            }
        }
    }
    Ok(out)
}

/// One projection coded at every k some output needs.
struct CodedProjection {
    /// Each code, by growing k: its report as coded, the code and its stored bits.
    codes: Vec<CodedAt>,
    /// The codes at the k's of [`BUDGET_BITS`], where an output is a budget.
    candidates: Vec<CandidateReport>,
    /// Every code's warnings, each once.
    warnings: Vec<String>,
    /// Seconds spent reading and coding it at every k.
    seconds: f64,
}

impl CodedProjection {
    /// The code at `k`.
    fn at(&self, k: u32) -> Result<&CodedAt> {
        match self.codes.iter().find(|(r, _, _)| r.bits == k) {
            Some(code) => Ok(code),
            None => invalid!("quantize_model: {}: no code at the chosen k {k}", self.codes[0].0.module),
        }
    }
}

/// The shared body of [`quantize_model`] and [`quantize_model_allocations`]: checks, codes every
/// projection at every k the outputs need, then writes each output.
fn quantize_outputs(
    gguf_path: &Path,
    spec: &QuantizeSpec,
    hessians: Option<&Hessians>,
    outputs: &[(Allocation, &Path)],
    progress: &mut dyn FnMut(QuantizeProgress<'_>),
) -> Result<Vec<QuantizeReport>> {
    if outputs.is_empty() {
        invalid!("quantize_model: no output asked for");
    }
    let mut budgets = Vec::new();
    for (allocation, _) in outputs {
        match *allocation {
            Allocation::Budget(b) => budgets.push(b),
            Allocation::Uniform(k) => check_bits("bits", k)?,
        }
    }
    for (name, &k) in &spec.bits_overrides {
        check_bits(name, k)?;
    }
    if let Some(k) = spec.attention_bits {
        check_bits("attention_bits", k)?;
        if !spec.attention {
            invalid!(
                "quantize_model: attention_bits = {k} without attention (the attention projections are not coded)"
            );
        }
    }
    if let Some(axis) = spec.attention_axis {
        if axis > 1 {
            invalid!("quantize_model: attention_axis = {axis} must be 0 (along the outputs) or 1 (along the inputs)");
        }
        if !spec.attention {
            invalid!(
                "quantize_model: attention_axis = {axis} without attention (the attention projections are not coded)"
            );
        }
    }
    if let Some(b) = budgets.first() {
        if !spec.bits_overrides.is_empty() || spec.attention_bits.is_some() {
            invalid!("quantize_model: a budget picks every projection's bits; bits overrides (and attention_bits) are refused with it");
        }
        if hessians.is_none() {
            invalid!("quantize_model: a budget of {b} bits per weight needs the calibration H of the layer inputs (its proxy errors)");
        }
    }
    if spec.ldlq.is_some() && hessians.is_none() {
        invalid!("quantize_model: LDLQ needs the calibration H of the layer inputs");
    }
    // Two outputs in one directory would overwrite each other's files.
    let mut dirs: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, (_, dir)) in outputs.iter().enumerate() {
        if let Some(first) = dirs.insert(dir_identity(dir)?, i) {
            invalid!(
                "quantize_model: outputs {} ({}) and {} ({}) are one directory; each output needs its own",
                first + 1,
                outputs[first].1.display(),
                i + 1,
                dir.display()
            );
        }
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
    let block_len = |out: usize, inf: usize, conventional: u32| -> Result<u32> {
        if spec.fit_blocks {
            fitting_block_len(out, inf, conventional)
        } else {
            Ok(BLOCK_LEN)
        }
    };
    let mut plan = Vec::new();
    for n in 0..coded_layers {
        for linear in LINEARS {
            if is_mlp(linear) || spec.attention {
                let module = hf_module(n, linear);
                let tensor = gguf_tensor_name(&module)?;
                let axis = match spec.attention_axis {
                    Some(axis) if !is_mlp(linear) => axis,
                    _ => conventional_axis(linear),
                };
                plan.push((module, tensor, axis));
            }
        }
    }
    if let Some(name) = spec.bits_overrides.keys().find(|name| !plan.iter().any(|(m, _, _)| override_matches(name, m)))
    {
        invalid!("quantize_model: the bits override {name:?} names no coded projection of this model");
    }

    if !budgets.is_empty() {
        // The cheapest choice, every projection at the smallest k, from the shapes alone: an
        // impossible budget is refused before anything is coded.
        let (mut bits, mut weights) = (0u64, 0u64);
        for (_, tensor, conventional) in &plan {
            let [out, inf] = gguf.tensor_shape(tensor)?[..] else {
                invalid!("{tensor} is not a 2-D weight [out, in]");
            };
            let choice = choose_axis(out, inf, *conventional, block_len(out, inf, *conventional)? as usize)?;
            // The stored rows are the other dimension; the sizes come from a validated header.
            let rows = if choice.axis == 0 { inf } else { out } as u64;
            let signs = if spec.rotation { choice.logical as u64 } else { 0 };
            let tensor_bits = rows
                .checked_mul(choice.stored as u64 * u64::from(BUDGET_BITS[0]))
                .and_then(|b| b.checked_add(16 * rows + 16 * signs))
                .and_then(|b| b.checked_add(bits));
            let tensor_weights = (out as u64).checked_mul(inf as u64).and_then(|w| w.checked_add(weights));
            let (Some(b), Some(w)) = (tensor_bits, tensor_weights) else {
                invalid!("quantize_model: {tensor}: [{out}, {inf}] overflows a count of bits");
            };
            (bits, weights) = (b, w);
        }
        let least = bits as f64 / weights as f64;
        for &budget in &budgets {
            if !budget.is_finite() {
                invalid!("quantize_model: a budget of {budget} bits per weight is not a finite number");
            }
            if budget < least {
                invalid!("quantize_model: a budget of {budget} bits per weight is below the least these projections store, {least:.4} (all at k {})", BUDGET_BITS[0]);
            }
        }
    }

    // Every projection's codes: one per k some output needs. The projections are read a window at
    // a time; the window's projections at one k are coded together, Hessian-weighted ones with
    // their feedback steps in lockstep (code_projections), so one search call serves a step of all.
    let ks_of = |module: &str| -> BTreeSet<u32> {
        let mut ks = BTreeSet::new();
        for (allocation, _) in outputs {
            match *allocation {
                Allocation::Budget(_) => ks.extend(BUDGET_BITS),
                Allocation::Uniform(k) => {
                    ks.insert(uniform_k(spec, module, k));
                }
            }
        }
        ks
    };
    let mut coded: Vec<CodedProjection> = Vec::with_capacity(plan.len());
    let mut first = 0;
    while first < plan.len() {
        let mut end = first;
        let mut window_weights = 0usize;
        while end < plan.len() {
            let size: usize = gguf.tensor_shape(&plan[end].1)?.iter().product();
            if end > first && window_weights.saturating_add(size) > WINDOW_WEIGHTS {
                break;
            }
            window_weights = window_weights.saturating_add(size);
            end += 1;
        }
        // The window's dense weights `[out, in]`, each read once for all its k's.
        let mut dense = Vec::with_capacity(end - first);
        for (module, tensor, _) in &plan[first..end] {
            let start = Instant::now();
            let d = (|| {
                let w = gguf.dense_f32(tensor)?;
                let [out, inf] = w.try_shape()?[..] else {
                    invalid!("{tensor} has shape {:?}, expected a 2-D weight [out, in]", w.shape());
                };
                Ok((w.astype(Dtype::Float32)?.to_vec::<f32>()?, out, inf))
            })()
            .with_context(|| format!("coding {tensor} of {} as {module}", gguf_path.display()))?;
            dense.push(d);
            coded.push(CodedProjection {
                codes: Vec::new(),
                candidates: Vec::new(),
                warnings: Vec::new(),
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        let window_ks: BTreeSet<u32> = plan[first..end].iter().flat_map(|(m, _, _)| ks_of(m)).collect();
        for k in window_ks {
            let members: Vec<usize> = (first..end).filter(|&i| ks_of(&plan[i].0).contains(&k)).collect();
            let jobs = members
                .iter()
                .map(|&i| {
                    let (module, _, conventional) = &plan[i];
                    let (w, out, inf) = &dense[i - first];
                    let t = block_len(*out, *inf, *conventional)?;
                    let choice = choose_axis(*out, *inf, *conventional, t as usize)?;
                    let coding = ProjectionCoding {
                        encoder: EncoderConfig {
                            axis: *conventional,
                            t,
                            threads: spec.threads,
                            backend: spec.backend,
                            ..EncoderConfig::new(k, spec.l)
                        },
                        rotation_seed: spec.rotation.then(|| rotation_seed(module, choice.axis, spec.seed)),
                        ldlq: spec.ldlq,
                        baseline: spec.baseline,
                        match_norms: spec.match_norms,
                    };
                    let hessian = hessians.and_then(|hs| hs.for_module(module));
                    Ok(ProjectionJob { module, w, out_features: *out, in_features: *inf, hessian, coding })
                })
                .collect::<Result<Vec<_>>>()
                .with_context(|| format!("coding {} at k {k}", gguf_path.display()))?;
            let start = Instant::now();
            let projections = members.len();
            let mut blocks = |done, total| progress(QuantizeProgress::Blocks { k, projections, done, total });
            let codes = code_projections(&jobs, &mut blocks)
                .with_context(|| format!("coding {} at k {k}", gguf_path.display()))?;
            // One run coded them all: each is given an even share of its time.
            let seconds = start.elapsed().as_secs_f64() / members.len() as f64;
            for (&i, c) in members.iter().zip(codes) {
                let (module, tensor, _) = &plan[i];
                let (_, out, inf) = dense[i - first];
                let p = &mut coded[i];
                // Reported as a candidate where the choice among its codes comes later.
                let several = ks_of(module).len() > 1 || !budgets.is_empty();
                let (bits, weights) = stored_bits(&c.coded, [out, inf]);
                let r = ModuleReport {
                    index: i + 1,
                    total: plan.len(),
                    module: module.clone(),
                    shape: [out, inf],
                    axis: c.choice.axis,
                    coded_len: (c.choice.logical, c.choice.stored),
                    block_len: c.coded.layer.geometry.t,
                    bits: k,
                    rotation_block: c.coded.coded_axis.rotation.as_ref().map(|r| r.block()),
                    relative_mse: c.coded.relative_mse(),
                    bits_per_weight: bits as f64 / weights as f64,
                    proxy: c.proxy,
                    baseline_proxy: c.baseline_proxy,
                    ldlq: c.ldlq,
                    warnings: c.warnings,
                    candidates: Vec::new(),
                    candidate: several,
                    seconds,
                };
                progress(QuantizeProgress::Coded(&r));
                if !budgets.is_empty() && BUDGET_BITS.contains(&k) {
                    let Some(proxy) = r.proxy else {
                        return Err(Error::invalid(format!(
                            "{module}: no proxy error at k {k} ({}); a budget needs one for every projection",
                            r.warnings.join("; ")
                        )))
                        .with_context(|| format!("coding {tensor} of {} as {module}", gguf_path.display()));
                    };
                    p.candidates.push(CandidateReport {
                        k,
                        bits_per_weight: r.bits_per_weight,
                        proxy,
                        baseline_proxy: r.baseline_proxy,
                        ldlq: r.ldlq,
                    });
                }
                for w in &r.warnings {
                    if !p.warnings.contains(w) {
                        p.warnings.push(w.clone());
                    }
                }
                p.seconds += seconds;
                p.codes.push((r, c.coded, bits));
            }
        }
        first = end;
    }

    // Each projection's candidates for the budgets: the same for every budget.
    let tensors: Vec<TensorOptions> = if budgets.is_empty() {
        Vec::new()
    } else {
        coded
            .iter()
            .map(|p| {
                let candidates = p
                    .candidates
                    .iter()
                    .map(|c| Ok(BitCandidate { k: c.k, stored_bits: p.at(c.k)?.2, error: c.proxy.error }))
                    .collect::<Result<_>>()?;
                let r = &p.codes[0].0;
                Ok(TensorOptions { name: r.module.clone(), weights: (r.shape[0] * r.shape[1]) as u64, candidates })
            })
            .collect::<Result<_>>()?
    };

    let mut reports = Vec::with_capacity(outputs.len());
    for &(allocation, out_dir) in outputs {
        // The k of every projection: the output's one (or its override), or the budget's choice.
        let chosen: Vec<u32> = match allocation {
            Allocation::Uniform(k) => coded.iter().map(|p| uniform_k(spec, &p.codes[0].0.module, k)).collect(),
            Allocation::Budget(budget) => allocate_bits(&tensors, budget)?.choices.iter().map(|c| c.k).collect(),
        };
        let mut layers_out = Vec::with_capacity(coded.len());
        let mut modules = Vec::with_capacity(coded.len());
        let (mut all_bits, mut all_weights) = (0u64, 0u64);
        for (p, k) in coded.iter().zip(chosen) {
            let (own, code, bits) = p.at(k)?;
            let mut report = own.clone();
            // A budget's report keeps every candidate; a code made for its output alone, the
            // time of reading it too.
            if let Allocation::Budget(_) = allocation {
                (report.candidates, report.warnings) = (p.candidates.clone(), p.warnings.clone());
                report.seconds = p.seconds;
            } else if p.codes.len() == 1 {
                report.seconds = p.seconds;
            }
            report.candidate = false;
            let weights = (report.shape[0] * report.shape[1]) as u64;
            let (Some(b), Some(w)) = (all_bits.checked_add(*bits), all_weights.checked_add(weights)) else {
                invalid!("quantize_model: the coded projections overflow a count of bits");
            };
            (all_bits, all_weights) = (b, w);
            layers_out.push((report.module.clone(), code.to_linear(&report.module)?));
            modules.push(report);
        }
        write_model_dir(gguf_path, out_dir, &layers_out, hidden, inter)?;
        reports.push(QuantizeReport {
            modules,
            bits_per_weight: all_bits as f64 / all_weights as f64,
            out_dir: out_dir.to_path_buf(),
        });
    }
    Ok(reports)
}

/// The most dense weights read at once for coding together: 512 MiB of f32, and about ten times
/// as much in all while they are coded (the rotated copies, LDLQ's f64 residuals, targets and
/// reconstructions of every projection in the lockstep). A projection larger than this is a
/// window alone.
const WINDOW_WEIGHTS: usize = 1 << 27;

fn check_bits(what: &str, k: u32) -> Result<()> {
    if !(2..=4).contains(&k) {
        invalid!("quantize_model: {what}: {k} bits per weight; the kernels serve 2, 3 and 4");
    }
    Ok(())
}

/// Writes a quantized model directory (see the module documentation): the coded modules `coded`
/// as `model.safetensors`, `config.json` naming the base model and its sizes (`hidden`,
/// `inter`), and the base GGUF `gguf_path` as `base.gguf` (linked where it can be). A stale shard
/// index in `out_dir` is removed.
pub fn write_model_dir(
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
