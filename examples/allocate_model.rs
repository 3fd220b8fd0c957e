//! Bits per tensor by a budget, weighted by what each tensor's code costs the model.
//!
//! `quantize_model --budget` picks each projection's k to minimize the summed proxy error
//! `tr(E H Eᵀ)`, whose scale differs between layers. This program measures instead what coding
//! each projection alone does to the model: the KL(as shipped ‖ one projection at k 2) per token on
//! a calibration text, and weights that projection's proxy errors at every k by it
//! (`error(k) = KL₂ · proxy(k) / proxy(2)`), then allocates each budget on those errors and writes
//! the model directories from the codes a `quantize_model --budget … --also-uniform` run already
//! made (no coding here).
//!
//! ```text
//! cargo run --release --example quantize_model -- --budget 2.5,3.0 --ldlq --also-uniform \
//!     --out set --report set.json
//! cargo run --release --example allocate_model -- --set set --report set.budget-3.0.json \
//!     --budget 2.5,3.0 --out sens
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use mlx_trellis::llama::eval::module_sensitivity;
use mlx_trellis::llama::quantize::write_model_dir;
use mlx_trellis::llama::{LayerPlan, LinearPlan, LlamaModel, LlamaTokenizer};
use mlx_trellis::trellis::encoder::allocate::{allocate_bits, BitCandidate, TensorOptions};
use mlx_trellis::trellis::{Artifact, TrellisLinear};
use mlx_trellis::Gguf;

#[path = "common/exit.rs"]
mod exit;

/// Bits per tensor by a budget, each tensor's proxy errors weighted by its measured KL.
#[derive(Parser, Debug)]
#[command(
    after_help = "Example:\n  cargo run --release --example allocate_model -- --set set --report set.budget-3.0.json \
--budget 2.5,3.0 --out sens"
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
    #[arg(long, value_name = "B,...", value_delimiter = ',', required = true)]
    budget: Vec<f64>,
    /// The calibration text the KLs are measured on (keep it apart from any evaluation text).
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-2")]
    text: PathBuf,
    /// Tokens of the text, in windows of 512.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    tokens: usize,
    /// Where to write `budget-B` for each budget.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write the measured KLs to this JSON file; with --reuse, read them from it when it exists.
    #[arg(long, value_name = "FILE")]
    sensitivity: Option<PathBuf>,
    /// Read the KLs from --sensitivity instead of measuring them, when the file exists.
    #[arg(long)]
    reuse: bool,
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

fn run(args: Args) -> Result<bool> {
    let start = Instant::now();
    let candidates = read_candidates(&args.report)?;
    let k2 = args.set.join("k2");
    let base = k2.join("base.gguf");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(k2.join("config.json"))?)?;
    let size = |key: &str| config[key].as_u64().with_context(|| format!("{}: no {key}", k2.display()));
    let (hidden, inter) = (size("hidden_size")? as usize, size("intermediate_size")? as usize);

    let modules: Vec<String> = candidates.iter().map(|c| c.module.clone()).collect();
    let stored = args.sensitivity.as_ref().filter(|p| args.reuse && p.exists());
    let kl: Vec<f64> = match stored {
        Some(path) => {
            let map: BTreeMap<String, f64> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
            modules
                .iter()
                .map(|m| {
                    let kl = map.get(m).copied().with_context(|| format!("{m} not in {}", path.display()))?;
                    ensure!(
                        kl.is_finite() && kl >= 0.0,
                        "{m}: KL {kl} in {} is not finite and non-negative",
                        path.display()
                    );
                    Ok(kl)
                })
                .collect::<Result<_>>()?
        }
        None => {
            let tokenizer = LlamaTokenizer::from_gguf(&Gguf::open(&base)?)?;
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
            let artifact = Artifact::open(&k2)?;
            eprintln!(
                "[allocate_model] measuring {} modules at k 2 on {} tokens of {}",
                modules.len(),
                tokens.len(),
                args.text.display()
            );
            let kl = module_sensitivity(&reference, &artifact, &modules, &windows, &mut |done, total| {
                eprintln!("[allocate_model] {done}/{total} ({:.0} s)", start.elapsed().as_secs_f64());
            })?;
            if let Some(path) = &args.sensitivity {
                let map: BTreeMap<&String, f64> = modules.iter().zip(kl.iter().copied()).collect();
                std::fs::write(path, serde_json::to_string_pretty(&map)?)?;
            }
            kl
        }
    };

    let tensors: Vec<TensorOptions> = candidates
        .iter()
        .zip(&kl)
        .map(|(c, &kl)| {
            let proxy2 = c.at.iter().find(|a| a.0 == 2).map(|a| a.2).unwrap_or(1.0);
            // KL per unit of proxy error at k 2 (a floor keeps a tensor whose KL rounds to 0 ordered).
            let weight = kl.max(1e-12) / proxy2.max(f64::MIN_POSITIVE);
            TensorOptions {
                name: c.module.clone(),
                weights: c.weights,
                candidates: c
                    .at
                    .iter()
                    .map(|&(k, bits, e)| BitCandidate { k, stored_bits: bits, error: weight * e })
                    .collect(),
            }
        })
        .collect();
    let artifacts: BTreeMap<u32, Artifact> = [2, 3, 4]
        .into_iter()
        .map(|k| Ok((k, Artifact::open(args.set.join(format!("k{k}")))?)))
        .collect::<Result<_>>()?;
    for &b in &args.budget {
        let choice = allocate_bits(&tensors, b)?;
        let mut layers: Vec<(String, TrellisLinear)> = Vec::with_capacity(tensors.len());
        let mut counts: BTreeMap<(String, u32), usize> = BTreeMap::new();
        for (t, c) in tensors.iter().zip(&choice.choices) {
            let a = artifacts.get(&c.k).with_context(|| format!("no k{} model in {}", c.k, args.set.display()))?;
            layers.push((t.name.clone(), a.module(&t.name)?));
            let kind = t.name.rsplit('.').next().unwrap_or("").to_string();
            *counts.entry((kind, c.k)).or_default() += 1;
        }
        // One decimal at least (3 -> budget-3.0), every digit given (3.038 -> budget-3.038).
        let name = if (b * 10.0).fract() == 0.0 { format!("budget-{b:.1}") } else { format!("budget-{b}") };
        let dir = args.out.join(name);
        write_model_dir(&base, &dir, &layers, hidden, inter)?;
        let summary: Vec<String> = counts.iter().map(|((kind, k), n)| format!("{kind} k{k}: {n}")).collect();
        println!("budget {b}: {} ({:.4} bits/weight) -> {}", summary.join(", "), choice.bits_per_weight, dir.display());
    }
    Ok(true)
}

fn main() {
    let args = Args::parse();
    exit::finish(run(args).context("allocate_model"), "allocate_model: failed")
}
