//! The variants of a Llama model that the model-level examples (`eval_model`, `bench_model`)
//! load side by side, named on the command line as `SPEC[|label=TEXT][|family=TEXT]`:
//!
//! - `shipped`: every layer as the GGUF ships it;
//! - `dense`: the MLP projections dequantized to dense weights in the activation dtype;
//! - `dense-all`: every linear layer dequantized so (the dense baseline of a whole coded model);
//! - `affine:BITS:GROUP`: the MLP projections re-quantized by MLX (e.g. `affine:4:64`);
//! - `affine-all:BITS:GROUP`: every linear layer re-quantized by MLX;
//! - `dir:PATH[:LABEL]`: a quantized model directory (trellis-coded modules over its base GGUF).
//!
//! A label's family (a plot's line) is the label up to its last space unless `family=` says.
#![allow(dead_code)] // each example uses a subset

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use mlx_trellis::llama::{LayerPlan, LinearPlan, LlamaModel};
use mlx_trellis::Dtype;

/// `--dtype`: the activation dtype the variants run in.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ActDtype {
    /// float32.
    F32,
    /// bfloat16.
    Bf16,
}

impl ActDtype {
    /// The MLX dtype.
    pub fn dtype(self) -> Dtype {
        match self {
            ActDtype::F32 => Dtype::Float32,
            ActDtype::Bf16 => Dtype::Bfloat16,
        }
    }
}

/// `--json`, `--plot`, `--markdown`: where a model-level example also writes its results.
#[derive(Args, Debug, Clone)]
pub struct ReportFiles {
    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw the results' plot as SVG, one line per family (eval_model) or variant (bench_model).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Also write the Markdown table (with its heading line) to this file.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

/// The help text that lists the variants.
pub const VARIANTS_HELP: &str = "Variants (repeat --variant; SPEC[|label=TEXT][|family=TEXT]):\n  \
shipped                  every layer as the GGUF ships it\n  \
dense                    the MLP projections dequantized to dense weights (the activation dtype)\n  \
dense-all                every linear layer dequantized to dense weights (the activation dtype)\n  \
affine:BITS:GROUP        the MLP projections re-quantized by MLX (e.g. affine:4:64)\n  \
affine-all:BITS:GROUP    every linear layer re-quantized by MLX\n  \
dir:PATH[:LABEL]         a quantized model directory (trellis-coded modules over its base GGUF)\n\
A variant's family (a plot's line) is its label up to the last space (\"trellis rotated k4\" -> \"trellis rotated\").";

/// Splits `SPEC|label=TEXT|family=TEXT` into the spec and its label and family overrides.
pub fn split_overrides(text: &str) -> Result<(&str, Option<String>, Option<String>)> {
    let mut parts = text.split('|');
    let spec = parts.next().unwrap_or_default();
    let (mut label, mut family) = (None, None);
    for part in parts {
        match part.split_once('=') {
            Some(("label", v)) if !v.is_empty() && label.is_none() => label = Some(v.to_string()),
            Some(("family", v)) if !v.is_empty() && family.is_none() => family = Some(v.to_string()),
            _ => bail!("{text:?}: {part:?} is not label=TEXT or family=TEXT (each at most once, not empty)"),
        }
    }
    Ok((spec, label, family))
}

/// A parsed variant.
pub enum Spec {
    /// Every layer as the GGUF ships it (the reference).
    Shipped,
    /// The GGUF loaded by a plan; the text names the layers it replaces.
    Plan(LayerPlan, &'static str),
    /// A quantized model directory.
    Dir(PathBuf),
}

/// `SPEC[|label=TEXT][|family=TEXT]` as the spec, its label and its family.
pub fn parse_spec(text: &str, dtype: Dtype) -> Result<(Spec, String, String)> {
    let (spec, label, family) = split_overrides(text)?;
    let (parsed, default_label, default_family) = parse_plain_spec(spec, dtype)?;
    let family = match (family, &label) {
        (Some(f), _) => f,
        (None, Some(l)) => l.rsplit_once(' ').map_or(l.as_str(), |(f, _)| f).to_string(),
        (None, None) => default_family,
    };
    Ok((parsed, label.unwrap_or(default_label), family))
}

fn parse_plain_spec(spec: &str, dtype: Dtype) -> Result<(Spec, String, String)> {
    let bits_group = |rest: &str| -> Result<(i32, i32)> {
        let (b, g) = rest.split_once(':').with_context(|| format!("{spec:?}: expected BITS:GROUP"))?;
        Ok((
            b.parse().with_context(|| format!("{spec:?}: bits"))?,
            g.parse().with_context(|| format!("{spec:?}: group"))?,
        ))
    };
    if spec == "shipped" {
        return Ok((Spec::Shipped, "as shipped".into(), "as shipped".into()));
    }
    if spec == "dense" {
        let plan = LayerPlan { dtype, mlp: LinearPlan::Dense, ..LayerPlan::shipped() };
        return Ok((Spec::Plan(plan, "MLP"), format!("dense {dtype}"), "dense".into()));
    }
    if spec == "dense-all" {
        let plan = LayerPlan { dtype, mlp: LinearPlan::Dense, attention: LinearPlan::Dense, ..LayerPlan::shipped() };
        return Ok((Spec::Plan(plan, "all"), format!("dense-all {dtype}"), "dense-all".into()));
    }
    if let Some(rest) = spec.strip_prefix("affine-all:") {
        let (bits, group) = bits_group(rest)?;
        let plan = LayerPlan { dtype, ..LayerPlan::all_affine(bits, group) };
        return Ok((Spec::Plan(plan, "all"), format!("affine-all g{group} {bits}"), format!("affine-all g{group}")));
    }
    if let Some(rest) = spec.strip_prefix("affine:") {
        let (bits, group) = bits_group(rest)?;
        let plan = LayerPlan { dtype, ..LayerPlan::mlp_affine(bits, group) };
        return Ok((Spec::Plan(plan, "MLP"), format!("affine g{group} {bits}"), format!("affine g{group}")));
    }
    if let Some(rest) = spec.strip_prefix("dir:") {
        let (path, label) = match rest.split_once(':') {
            Some((p, l)) => (PathBuf::from(p), l.to_string()),
            None => {
                let p = PathBuf::from(rest);
                let name = p.file_name().map_or_else(|| rest.to_string(), |n| n.to_string_lossy().into_owned());
                (p, name)
            }
        };
        let family = label.rsplit_once(' ').map_or(label.as_str(), |(f, _)| f).to_string();
        return Ok((Spec::Dir(path), label, family));
    }
    bail!("unknown variant {spec:?} (shipped, dense, dense-all, affine:BITS:GROUP, affine-all:BITS:GROUP, dir:PATH[:LABEL])")
}

/// Loads a variant over the base GGUF `base`: `None` for [`Spec::Shipped`] (the caller's
/// reference), with the layers it replaces ("none", "MLP", "all", "N coded").
pub fn load(spec: &Spec, base: &PathBuf, dtype: Dtype) -> Result<(Option<LlamaModel>, String)> {
    Ok(match spec {
        Spec::Shipped => (None, "none".into()),
        Spec::Plan(plan, layers) => (Some(LlamaModel::from_gguf(base, plan)?), (*layers).into()),
        Spec::Dir(dir) => {
            let m = LlamaModel::from_artifact(dir, dtype)?;
            let n = m.replaced_modules().len();
            (Some(m), format!("{n} coded"))
        }
    })
}
