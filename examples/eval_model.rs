//! What quantization costs a Llama model: perplexity and mean KL divergence per token against the
//! model as shipped, on a fixed text, for several variants of its linear layers.
//!
//! The text (default `/usr/share/common-licenses/GPL-3`, on every Debian machine) is tokenized
//! whole and cut into non-overlapping windows of `--window` tokens, each scored from an empty
//! cache (every position but the last predicts the next token). For each window the as-shipped
//! model's log-probabilities are computed once and every variant is scored against them, all
//! variants held in memory. Per variant: perplexity, mean KL(shipped ‖ variant) in nats per
//! token, bits per weight of the layers it replaces (scales and biases included) and load time.
//! Speed is `bench_model`'s job: this program's forward passes include the first use's kernel
//! compilation, so their time says nothing about how fast a variant runs.
//!
//! ```text
//! cargo run --release --example eval_model -- --variant shipped --variant affine:4:64 \
//!     --variant dir:/models/smollm2-trellis-k4:trellis rotated k4 --json eval.json --plot eval.svg
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::llama::eval::{log_probs, log_probs_decoded, score_window, WindowScore};
use mlx_trellis::llama::{fetch_smollm2, LayerPlan, LlamaModel, LlamaTokenizer};

#[path = "common/plot.rs"]
mod plot;
#[path = "common/variants.rs"]
mod variants;
use mlx_trellis::{eval_all, Gguf};
use variants::{load, parse_spec, ActDtype, ReportFiles};

/// Perplexity and KL against the as-shipped model for variants of a Llama model's linear layers.
#[derive(Parser, Debug)]
#[command(after_help = format!("{}\n\nExample:\n  cargo run --release --example eval_model -- --variant shipped \
--variant affine:4:64 --variant affine:3:64 --json eval.json --plot eval.svg", variants::VARIANTS_HELP))]
struct Args {
    /// The base GGUF file (default: SmolLM2-135M-Instruct, fetched and cached).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The evaluation text.
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
    text: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Evaluate only the first N tokens of the text (0: all).
    #[arg(long, default_value_t = 0)]
    max_tokens: usize,
    /// A variant to evaluate (repeatable; see below). Default: shipped.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Activation dtype.
    #[arg(long, value_enum, default_value_t = ActDtype::F32)]
    dtype: ActDtype,
    /// Score every model (the shipped one too) the way it generates: one token at a time
    /// through the cache, every projection at one row, as `bench_model` times it (slower: use
    /// with --max-tokens). Without it each window runs as one prefill.
    #[arg(long)]
    decode: bool,
    #[command(flatten)]
    out: ReportFiles,
    /// Evaluate nothing: plot the rows of this JSON (an earlier `--json`, or rows of several runs
    /// put together) to the --plot file.
    #[arg(long, value_name = "JSON", requires = "plot")]
    replot: Option<PathBuf>,
}

struct Variant {
    label: String,
    family: String,
    layers: String,
    /// `None`: the reference itself (as shipped), whose log-probabilities are computed once.
    model: Option<LlamaModel>,
    load_seconds: f64,
    score: WindowScore,
}

fn run(args: Args) -> Result<()> {
    if let (Some(json), Some(svg)) = (&args.replot, &args.out.plot) {
        let rows: Vec<serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?,
        )
        .with_context(|| format!("{}: not a JSON list of rows", json.display()))?;
        return plot_rows(&rows, svg);
    }
    let dtype = args.dtype.dtype();
    if args.window < 2 {
        bail!("--window must be at least 2");
    }
    let base = match &args.model {
        Some(p) => p.clone(),
        None => fetch_smollm2()?,
    };
    let text = std::fs::read_to_string(&args.text).with_context(|| format!("reading {}", args.text.display()))?;
    let tokenizer = LlamaTokenizer::from_gguf(&Gguf::open(&base)?)?;
    let mut tokens = tokenizer.encode(&text)?;
    if args.max_tokens > 0 {
        tokens.truncate(args.max_tokens);
    }
    let windows: Vec<&[u32]> = tokens.chunks(args.window).filter(|w| w.len() >= 2).collect();
    if windows.is_empty() {
        bail!("the text has fewer than 2 tokens");
    }
    eprintln!("{}: {} tokens, {} windows of up to {}", args.text.display(), tokens.len(), windows.len(), args.window);

    let specs = if args.variants.is_empty() { vec!["shipped".to_string()] } else { args.variants.clone() };
    let t = Instant::now();
    let reference = LlamaModel::from_gguf(&base, &LayerPlan { dtype, ..LayerPlan::shipped() })?;
    let reference_load_seconds = t.elapsed().as_secs_f64();
    eprintln!("reference (as shipped) loaded in {reference_load_seconds:.2} s");
    let mut variants = Vec::new();
    for s in &specs {
        let (spec, label, family) = parse_spec(s, dtype)?;
        let t = Instant::now();
        let (model, layers) = load(&spec, &base, dtype).with_context(|| format!("loading variant {s:?}"))?;
        let load_seconds = if model.is_none() { reference_load_seconds } else { t.elapsed().as_secs_f64() };
        eprintln!("{label}: loaded in {load_seconds:.2} s");
        variants.push(Variant { label, family, layers, model, load_seconds, score: WindowScore::default() });
    }

    let start = Instant::now();
    let log_probs = if args.decode { log_probs_decoded } else { log_probs };
    for (i, w) in windows.iter().enumerate() {
        let ref_logp = log_probs(&reference, w)?;
        eval_all(&[&ref_logp])?;
        for v in &mut variants {
            let Some(model) = &v.model else {
                v.score += score_window(&ref_logp, &ref_logp, w)?;
                continue;
            };
            let logp = log_probs(model, w)?;
            eval_all(&[&logp])?;
            v.score += score_window(&ref_logp, &logp, w)?;
        }
        let summary: Vec<String> =
            variants.iter().map(|v| format!("{} KL {:.4}", v.label, v.score.kl / v.score.positions as f64)).collect();
        eprintln!(
            "window {}/{} ({:.0} s): {}",
            i + 1,
            windows.len(),
            start.elapsed().as_secs_f64(),
            summary.join(", ")
        );
    }

    let evaluated: usize = windows.iter().map(|w| w.len()).sum();
    let mut table = vec![
        format!(
            "{} tokens of {} in {} windows of {}, {} activations, {}; KL(as shipped ‖ variant) in nats per token; bits/weight over the replaced layers (scales and biases included; as shipped: the MLP's)\n",
            evaluated,
            args.text.display(),
            windows.len(),
            args.window,
            dtype,
            if args.decode { "decoded a token at a time" } else { "each window one prefill" }
        ),
        "| variant | family | layers replaced | bits/weight | KL | perplexity | load (s) |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut rows = Vec::new();
    for v in &variants {
        let model = v.model.as_ref().unwrap_or(&reference);
        let replaced = model.replaced_modules();
        let bpw = if replaced.is_empty() {
            model.bits_per_weight(|n| n.contains(".mlp."))
        } else {
            model.bits_per_weight(|n| replaced.contains(n))
        };
        let kl = v.score.kl / v.score.positions as f64;
        let ppl = (v.score.nll / v.score.positions as f64).exp();
        table.push(format!(
            "| {} | {} | {} | {} | {kl:.4} | {ppl:.2} | {:.2} |",
            v.label,
            v.family,
            v.layers,
            bpw.map_or("–".into(), |b| format!("{b:.3}")),
            v.load_seconds
        ));
        rows.push(serde_json::json!({
            "label": v.label, "family": v.family, "layers": v.layers, "bits_per_weight": bpw,
            "kl": kl, "perplexity": ppl, "load_seconds": v.load_seconds,
            "positions": v.score.positions, "tokens": evaluated, "window": args.window,
            "text": args.text.display().to_string(), "dtype": dtype.to_string(),
            "mode": if args.decode { "decode" } else { "prefill" },
        }));
    }
    for line in &table {
        println!("{line}");
    }
    if let Some(path) = &args.out.markdown {
        std::fs::write(path, table.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("evaluation took {:.0} s", start.elapsed().as_secs_f64());
    if let Some(path) = &args.out.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.out.plot {
        plot_rows(&rows, path)?;
    }
    Ok(())
}

/// KL against bits per weight, a line per family of variants.
fn plot_rows(rows: &[serde_json::Value], path: &std::path::Path) -> Result<()> {
    plot::lines(
        &variants_points(rows),
        path,
        &plot::Chart {
            caption: "KL(as shipped ‖ variant) per token against bits per weight",
            x_desc: "bits per weight (scales included)",
            y_desc: "KL (nats/token)",
            x_log: false,
            y_log: true,
        },
    )
    .with_context(|| format!("plotting {}", path.display()))
}

/// (family, [(bits/weight, KL)]) of every variant that replaced layers and has a positive KL.
fn variants_points(rows: &[serde_json::Value]) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let (Some(bpw), Some(kl), Some(family)) =
            (r["bits_per_weight"].as_f64(), r["kl"].as_f64(), r["family"].as_str())
        else {
            continue;
        };
        if r["layers"] == "none" || kl <= 0.0 {
            continue;
        }
        match series.iter_mut().find(|(f, _)| f == family) {
            Some((_, v)) => v.push((bpw, kl)),
            None => series.push((family.to_string(), vec![(bpw, kl)])),
        }
    }
    for (_, v) in &mut series {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).context("eval_model") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
