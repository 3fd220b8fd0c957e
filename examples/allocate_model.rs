//! Bits per tensor by a budget, weighted by what each tensor's code costs the model.
//!
//! `quantize_model --budget` picks each projection's k to minimize the summed proxy error
//! `tr(E H Eᵀ)`, whose scale differs between layers. This program measures instead what coding
//! each projection alone does to the model: KL(as shipped ‖ one projection at k) per token on a
//! calibration text, for each k of `--measure`. A projection's error at a measured k is that KL;
//! at any other k it is its proxy error scaled by the KL over the proxy error at the nearest
//! measured k (`error(k) = KL_j · proxy(k) / proxy(j)`). Each budget is allocated on those errors
//! and its model directory is written from the codes a `quantize_model --budget … --also-uniform`
//! run already made (no coding here).
//!
//! ```text
//! cargo run --release --example quantize_model -- --budget 2.5,3.0 --ldlq --also-uniform \
//!     --out set --report set.json
//! cargo run --release --example allocate_model -- --set set --report set.budget-3.0.json \
//!     --budget 2.5,3.0 --measure 2,3,4 --out sens
//! ```
//!
//! `--tie gate_proj,up_proj` makes the projections of one block with those names share one k
//! (allocated as one tensor), so that a runner can still pair their launches; `--measure-only`
//! measures and writes the KLs (`--sensitivity`) without allocating, for a machine that holds only
//! the measured widths' model directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use mlx_trellis::llama::eval::module_sensitivity;
use mlx_trellis::llama::quantize::write_model_dir;
use mlx_trellis::llama::{LayerPlan, LinearPlan, LlamaConfig, LlamaModel, LlamaTokenizer};
use mlx_trellis::trellis::encoder::allocate::{
    allocate_bits, kl_weighted_candidates, tie_tensors, BitCandidate, TensorOptions, TiedTensors,
};
use mlx_trellis::trellis::{Artifact, TrellisLinear};
use mlx_trellis::Gguf;

#[path = "common/exit.rs"]
mod exit;

/// Bits per tensor by a budget, each tensor's proxy errors weighted by its measured KL.
#[derive(Parser, Debug)]
#[command(
    after_help = "Example:\n  cargo run --release --example allocate_model -- --set set --report set.budget-3.0.json \
--budget 2.5,3.0 --measure 2,3,4 --out sens"
)]
struct Args {
    /// The output parent of a `quantize_model --budget … --also-uniform` run: its k2, k3 and k4
    /// model directories.
    #[arg(long, value_name = "DIR")]
    set: PathBuf,
    /// A budget report of that run (`--report`): every projection's proxy error at k 2, 3 and 4.
    #[arg(long, value_name = "FILE")]
    report: PathBuf,
    /// Budgets in bits per weight, comma-separated.
    #[arg(long, value_name = "B,...", value_delimiter = ',', required_unless_present = "measure_only")]
    budget: Vec<f64>,
    /// Projections that share one k in each block, as the last parts of their names,
    /// comma-separated (gate_proj,up_proj); repeatable. Each block's tied projections are
    /// allocated as one tensor (their bits and errors summed), so a runner keeps one launch for
    /// both.
    #[arg(long, value_name = "NAME,NAME,...")]
    tie: Vec<String>,
    /// The calibration text the KLs are measured on (keep it apart from any evaluation text).
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-2")]
    text: PathBuf,
    /// Tokens of the text, in windows of 512.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    tokens: usize,
    /// The widths at which each projection's KL is measured, comma-separated (one model
    /// evaluation per projection and width); errors at other widths are scaled from the nearest.
    #[arg(long, value_name = "K,...", value_delimiter = ',', default_value = "2", value_parser = clap::value_parser!(u32).range(2..=4))]
    measure: Vec<u32>,
    /// Where to write `budget-B` for each budget.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write the measured KLs to this JSON file; with --reuse, read them from it when it exists.
    #[arg(long, value_name = "FILE")]
    sensitivity: Option<PathBuf>,
    /// Read the KLs from --sensitivity instead of measuring them, when the file exists.
    #[arg(long)]
    reuse: bool,
    /// Measure the KLs, write them to --sensitivity and stop (no allocation; only the measured
    /// widths' model directories need exist).
    #[arg(long, requires = "sensitivity", conflicts_with = "reuse")]
    measure_only: bool,
}

/// One projection's candidates from the report: (k, stored bits, proxy error).
struct Candidates {
    module: String,
    weights: u64,
    at: Vec<(u32, u64, f64)>,
}

fn read_candidates(report: &Path) -> Result<Vec<Candidates>> {
    let text = std::fs::read_to_string(report).with_context(|| format!("reading {}", report.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", report.display()))?;
    let modules = json["modules"].as_array().context("the report has no modules")?;
    let mut out = Vec::with_capacity(modules.len());
    for m in modules {
        let module = m["module"].as_str().context("a module without a name")?.to_string();
        let shape: Vec<u64> = m["shape"].as_array().context("shape")?.iter().filter_map(|v| v.as_u64()).collect();
        let [o, i] = shape[..] else { bail!("{module}: shape {shape:?}") };
        let weights = o.checked_mul(i).context("weights overflow")?;
        let mut at = Vec::new();
        for c in m["candidates"].as_array().with_context(|| format!("{module}: no candidates (a budget report?)"))? {
            let k =
                c["k"].as_u64().filter(|k| (2..=4).contains(k)).with_context(|| format!("{module}: k {}", c["k"]))?
                    as u32;
            let bpw = c["bits_per_weight"].as_f64().filter(|b| b.is_finite() && *b > 0.0 && *b <= 64.0);
            let error = c["proxy"]["error"].as_f64().filter(|e| e.is_finite() && *e >= 0.0);
            let (Some(bpw), Some(error)) = (bpw, error) else {
                bail!(
                    "{module} k {k}: bits per weight {} and proxy error {} must be finite and positive",
                    c["bits_per_weight"],
                    c["proxy"]["error"]
                );
            };
            at.push((k, (bpw * weights as f64).round() as u64, error));
        }
        ensure!(at.iter().any(|c| c.0 == 2), "{module}: no candidate at k 2");
        out.push(Candidates { module, weights, at });
    }
    Ok(out)
}

/// The KLs stored by an earlier run at the widths of `measure`: `{module: {k: KL}}`, or
/// `{module: KL}` (a KL at k 2, the format before `--measure`); every module and width must be
/// present, and widths outside `measure` are left out.
fn read_sensitivity(path: &Path, modules: &[String], measure: &[u32]) -> Result<Vec<BTreeMap<u32, f64>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    modules
        .iter()
        .map(|m| {
            let entry = json.get(m).with_context(|| format!("{m} not in {}", path.display()))?;
            let mut at = BTreeMap::new();
            match entry {
                serde_json::Value::Number(n) => {
                    at.insert(2, n.as_f64().context("KL")?);
                }
                serde_json::Value::Object(o) => {
                    for (k, v) in o {
                        let k: u32 = k
                            .parse()
                            .ok()
                            .filter(|k| (2..=4).contains(k))
                            .with_context(|| format!("{m}: width {k:?} in {}", path.display()))?;
                        at.insert(k, v.as_f64().with_context(|| format!("{m} k {k}: KL {v}"))?);
                    }
                }
                other => bail!("{m}: {other} in {} is not a KL", path.display()),
            }
            // Their values are checked where they are used (kl_weighted_candidates).
            if let Some(k) = measure.iter().find(|k| !at.contains_key(k)) {
                bail!("{m}: no KL at k {k} in {} (measure it: leave out --reuse)", path.display());
            }
            // Only the widths asked for: the others are scaled, as if never measured.
            at.retain(|k, _| measure.contains(k));
            Ok(at)
        })
        .collect()
}

/// `--tie` values as groups of names (checked by `tie_tensors`).
fn parse_ties(ties: &[String]) -> Vec<Vec<String>> {
    ties.iter().map(|tie| tie.split(',').map(|n| n.trim().to_string()).collect()).collect()
}

fn run(args: Args) -> Result<bool> {
    let start = Instant::now();
    let candidates = read_candidates(&args.report)?;
    let base = args.set.join("k2").join("base.gguf");
    let gguf = Gguf::open(&base)?;
    let config = LlamaConfig::from_gguf(&gguf)?;
    let open = |k: u32| Artifact::open(args.set.join(format!("k{k}")));
    let ties = parse_ties(&args.tie);
    // The ties checked on the proxy errors before anything is measured (which takes long).
    let proxies: Vec<TensorOptions> = candidates
        .iter()
        .map(|c| TensorOptions {
            name: c.module.clone(),
            weights: c.weights,
            candidates: c.at.iter().map(|&(k, stored_bits, error)| BitCandidate { k, stored_bits, error }).collect(),
        })
        .collect();
    tie_tensors(&proxies, &ties).context("--tie")?;

    let modules: Vec<String> = candidates.iter().map(|c| c.module.clone()).collect();
    let mut measure = args.measure.clone();
    measure.sort_unstable();
    measure.dedup();
    let stored = args.sensitivity.as_ref().filter(|p| args.reuse && p.exists());
    let kl: Vec<BTreeMap<u32, f64>> = match stored {
        Some(path) => read_sensitivity(path, &modules, &measure)?,
        None => {
            let tokenizer = LlamaTokenizer::from_gguf(&gguf)?;
            let text =
                std::fs::read_to_string(&args.text).with_context(|| format!("reading {}", args.text.display()))?;
            let mut tokens = tokenizer.encode(&text)?;
            tokens.truncate(args.tokens);
            let windows: Vec<&[u32]> = tokens.chunks(512).filter(|w| w.len() >= 2).collect();
            // The shipped weights dequantized (the same model, up to rounding), which MLX's CPU
            // back-end multiplies far faster than its quantized layers.
            let dense = LinearPlan::Dense;
            let reference =
                LlamaModel::from_gguf(&base, &LayerPlan { mlp: dense, attention: dense, ..LayerPlan::shipped() })?;
            let mut kl = vec![BTreeMap::new(); modules.len()];
            for &k in &measure {
                let artifact = &open(k)?;
                eprintln!(
                    "[allocate_model] measuring {} modules at k {k} on {} tokens of {}",
                    modules.len(),
                    tokens.len(),
                    args.text.display()
                );
                let at_k = module_sensitivity(&reference, artifact, &modules, &windows, &mut |done, total| {
                    if done % 10 == 0 || done == total {
                        eprintln!("[allocate_model] k {k}: {done}/{total} ({:.0} s)", start.elapsed().as_secs_f64());
                    }
                })?;
                for (m, v) in kl.iter_mut().zip(at_k) {
                    m.insert(k, v);
                }
            }
            if let Some(path) = &args.sensitivity {
                let map: BTreeMap<&String, &BTreeMap<u32, f64>> = modules.iter().zip(&kl).collect();
                std::fs::write(path, serde_json::to_string_pretty(&map)?)?;
            }
            kl
        }
    };
    if args.measure_only {
        println!("KLs of {} modules at k {measure:?} written", modules.len());
        return Ok(true);
    }
    let artifacts: BTreeMap<u32, Artifact> = [2, 3, 4].into_iter().map(|k| Ok((k, open(k)?))).collect::<Result<_>>()?;

    let tensors: Vec<TensorOptions> = candidates
        .iter()
        .zip(&kl)
        .map(|(c, kl)| {
            let candidates = kl_weighted_candidates(&c.at, kl).with_context(|| c.module.clone())?;
            Ok(TensorOptions { name: c.module.clone(), weights: c.weights, candidates })
        })
        .collect::<Result<_>>()?;
    let TiedTensors { tensors: groups, members } = tie_tensors(&tensors, &ties).context("--tie")?;
    for &b in &args.budget {
        let choice = allocate_bits(&groups, b)?;
        let mut layers: Vec<(String, TrellisLinear)> = Vec::with_capacity(tensors.len());
        let mut counts: BTreeMap<(String, u32), usize> = BTreeMap::new();
        for (group, c) in members.iter().zip(&choice.choices) {
            let a = artifacts.get(&c.k).with_context(|| format!("no k{} model in {}", c.k, args.set.display()))?;
            for &t in group {
                let name = &tensors[t].name;
                layers.push((name.clone(), a.module(name)?));
                let kind = name.rsplit('.').next().unwrap_or("").to_string();
                *counts.entry((kind, c.k)).or_default() += 1;
            }
        }
        // One decimal at least (3 -> budget-3.0), every digit given (3.038 -> budget-3.038).
        let name = if (b * 10.0).fract() == 0.0 { format!("budget-{b:.1}") } else { format!("budget-{b}") };
        let dir = args.out.join(name);
        write_model_dir(&base, &dir, &layers, config.hidden, config.intermediate)?;
        let summary: Vec<String> = counts.iter().map(|((kind, k), n)| format!("{kind} k{k}: {n}")).collect();
        println!("budget {b}: {} ({:.4} bits/weight) -> {}", summary.join(", "), choice.bits_per_weight, dir.display());
    }
    Ok(true)
}

fn main() {
    let args = Args::parse();
    exit::finish(run(args).context("allocate_model"), "allocate_model: failed")
}
