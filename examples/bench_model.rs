//! How fast a Llama model's variants run: decoding tokens/s, and the time of one MLP layer in the
//! model's own chain of MLPs, every variant loaded side by side and measured in the same run.
//!
//! - **Decode**: per round, a fresh cache takes the prompt (untimed), `--warmup` one-token steps
//!   (untimed; the first round's compile every kernel the variant runs), then `--tokens` timed
//!   one-token steps. Every variant is fed the same fixed tokens (the prompt's, cycled), so its
//!   own predictions never change what it computes; each step waits for its logits' argmax on
//!   the host, as a sampler does. Reported: median tokens/s over the rounds.
//! - **Pipelined decode**: the same, but each greedy step is built from the token the previous
//!   step chose on the device and started before the host reads that token, as MLX's
//!   own generators run (`mlx_lm.generate`): the host's graph building then overlaps the GPU's
//!   work instead of adding to it. The tokens are the variant's own greedy choices; each step
//!   computes one token after the same number of cached positions.
//! - **MLP chain**: `x <- x + mlp_b(rms_norm(x))` over the model's blocks `b` in order (each
//!   block's weights distinct, as the model runs them), `--chains` passes queued per evaluation,
//!   for each row count M of `--rows`. Timed from building the graph to its result, so the host's
//!   per-call cost counts as it does in a model. Reported: median µs per MLP layer.
//!
//! Rounds visit the variants in turn, so a drift in clocks or temperature hits them alike. Ratios
//! are against the first `dense` variant (else the first variant): above 1 is faster.
//! Speed is only half a claim: measure the same variants' quality with `eval_model`.
//!
//! ```text
//! cargo run --release --example bench_model -- --variant dense --variant affine:4:64 \
//!     --variant dir:/models/smollm2-ldlq-k3:trellis k3 --json speed.json --plot speed.svg
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::llama::{fetch_smollm2, DeviceToken, LayerPlan, LlamaModel, LlamaTokenizer};
use mlx_trellis::nn::select::argmax;
use mlx_trellis::{async_eval_all, eval_all, Gguf, MlxArray};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;
#[path = "common/graphs.rs"]
mod graphs;
#[path = "common/plot.rs"]
mod plot;
#[path = "common/variants.rs"]
mod variants;

use variants::{load, parse_spec, ActDtype, ReportFiles, Spec};

/// Decoding speed and MLP-layer time of variants of a Llama model, in one run.
#[derive(Parser, Debug)]
#[command(after_help = format!("{}\n\nExample:\n  cargo run --release --example bench_model -- --variant dense \
--variant affine:4:64 --variant 'dir:/tmp/smollm2-k3|label=trellis k3' --json speed.json --plot speed.svg",
    variants::VARIANTS_HELP))]
struct Args {
    /// The base GGUF file (default: SmolLM2-135M-Instruct, fetched and cached).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A variant to measure (repeatable; see below). Default: dense and shipped.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Activation dtype.
    #[arg(long, value_enum, default_value_t = ActDtype::Bf16)]
    dtype: ActDtype,
    /// The prompt whose tokens (cycled) feed the decode steps.
    #[arg(long, default_value = "The capital of France is Paris. The capital of Italy is Rome.")]
    prompt: String,
    /// Untimed one-token steps before each round's timed ones.
    #[arg(long, value_name = "N", default_value_t = 8)]
    warmup: usize,
    /// Timed one-token steps per round (0: no decode measurement).
    #[arg(long, value_name = "N", default_value_t = 64)]
    tokens: usize,
    /// Rounds (each variant measured once per round); medians are reported.
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value_t = 5)]
    rounds: usize,
    /// Row counts M of the MLP chain, comma-separated (empty: no MLP measurement).
    #[arg(long, value_name = "M,...", value_parser = cli::count_list, default_value = "1,8,32,128")]
    rows: cli::CountList,
    /// Passes over the model's MLPs queued per evaluation of the MLP chain.
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value_t = 4)]
    chains: usize,
    #[command(flatten)]
    out: ReportFiles,
}

struct Variant {
    label: String,
    model: LlamaModel,
    bits_per_weight: Option<f64>,
    /// Tokens/s of each round.
    decode: Vec<f64>,
    /// Pipelined tokens/s of each round.
    pipelined: Vec<f64>,
    /// Per row count: µs per MLP layer of each round.
    mlp: Vec<Vec<f64>>,
    /// Per row count: of those, µs per layer spent building the graph before evaluation.
    graph: Vec<Vec<f64>>,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The median over rounds of `x`'s figure over the reference's in the same round: the variants
/// of a round run one after the other within seconds, so this ratio holds where the machine's
/// speed drifts between rounds (on a shared GPU, by half), where the ratio of the medians moves
/// with it. `None` without rounds or with a figure that is not positive.
fn median_round_ratio(reference: &[f64], x: &[f64]) -> Option<f64> {
    let ratios: Vec<f64> =
        reference.iter().zip(x).filter(|(r, x)| **r > 0.0 && **x > 0.0).map(|(r, x)| x / r).collect();
    (ratios.len() == x.len().min(reference.len())).then(|| median(&ratios)).flatten()
}

/// Tokens/s of `tokens` timed one-token steps after the prompt and `warmup` untimed steps.
fn decode_round(model: &LlamaModel, feed: &[u32], prompt: usize, warmup: usize, tokens: usize) -> Result<f64> {
    let mut cache = model.new_cache();
    let step = |tokens: &[u32], cache: &mut _| -> Result<()> {
        let logits = model.forward(tokens, cache)?;
        // The host waits for the next token, as sampling does.
        argmax(&logits, -1, false)?.eval()?;
        Ok(())
    };
    step(&feed[..prompt], &mut cache)?;
    let mut next = feed[prompt..].iter().chain(feed.iter()).cycle();
    for _ in 0..warmup {
        step(&[*next.next().context("no tokens")?], &mut cache)?;
    }
    let t = Instant::now();
    for _ in 0..tokens {
        step(&[*next.next().context("no tokens")?], &mut cache)?;
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64())
}

/// Tokens/s of `tokens` timed greedy steps after the prompt and `warmup` untimed steps, each step
/// built from the token the previous step chose on the device and started before the host reads
/// that token (see the module documentation).
fn decode_pipelined_round(
    model: &LlamaModel,
    feed: &[u32],
    prompt: usize,
    warmup: usize,
    tokens: usize,
) -> Result<f64> {
    let mut cache = model.new_cache();
    let mut token = model.greedy_token(&model.forward(&feed[..prompt], &mut cache)?)?;
    async_eval_all(&[token.array()])?;
    let mut step = |token: &DeviceToken| -> Result<DeviceToken> {
        let next = model.greedy_token(&model.forward_token(token, &mut cache)?)?;
        async_eval_all(&[next.array()])?;
        // The host reads the previous step's token while this one runs.
        token.read()?;
        Ok(next)
    };
    for _ in 0..warmup {
        token = step(&token)?;
    }
    let t = Instant::now();
    for _ in 0..tokens {
        token = step(&token)?;
    }
    let seconds = t.elapsed().as_secs_f64();
    // The step still in flight finishes before the next measurement starts.
    token.read()?;
    Ok(tokens as f64 / seconds)
}

/// µs per MLP layer of `chains` passes over the model's MLPs on `x`, graph building included, and
/// of those the µs per layer the host spent building the graph before the evaluation began (the
/// host work that the GPU cannot overlap with an earlier layer's kernels in a decoding step).
fn mlp_round(model: &LlamaModel, x: &MlxArray, chains: usize) -> Result<(f64, f64)> {
    let blocks = model.config().layers;
    let layers = chains.checked_mul(blocks).context("--chains times the model's layers overflows")? as f64;
    let t = Instant::now();
    let mut y = x.clone();
    for _ in 0..chains {
        for b in 0..blocks {
            y = model.mlp_residual(b, &y)?;
        }
    }
    let built = t.elapsed().as_secs_f64();
    eval_all(&[&y])?;
    Ok((t.elapsed().as_secs_f64() * 1e6 / layers, built * 1e6 / layers))
}

fn run(args: Args) -> Result<bool> {
    let dtype = args.dtype.dtype();
    let base = match &args.model {
        Some(p) => p.clone(),
        None => fetch_smollm2()?,
    };
    let tokenizer = LlamaTokenizer::from_gguf(&Gguf::open(&base)?)?;
    let feed = tokenizer.encode(&args.prompt)?;
    if feed.len() < 2 {
        bail!("--prompt {:?} has {} tokens; it needs at least 2", args.prompt, feed.len());
    }
    let prompt = feed.len() / 2;

    let specs = if args.variants.is_empty() { vec!["dense".into(), "shipped".into()] } else { args.variants.clone() };
    let mut variants = Vec::new();
    for s in &specs {
        let (spec, label, _) = parse_spec(s, dtype)?;
        let t = Instant::now();
        let model = match load(&spec, &base, dtype).with_context(|| format!("loading variant {s:?}"))? {
            (Some(m), _) => m,
            (None, _) => LlamaModel::from_gguf(&base, &LayerPlan { dtype, ..LayerPlan::shipped() })?,
        };
        let replaced = model.replaced_modules();
        let bits_per_weight = if replaced.is_empty() || matches!(spec, Spec::Plan(..)) {
            model.bits_per_weight(|n| n.contains(".mlp."))
        } else {
            model.bits_per_weight(|n| replaced.contains(n))
        };
        let needed = feed.len().checked_add(args.warmup).and_then(|n| n.checked_add(args.tokens));
        match needed {
            Some(n) if n <= model.config().context => {}
            _ => bail!(
                "the prompt's {} tokens, --warmup {} and --tokens {} exceed the model's context of {} positions",
                feed.len(),
                args.warmup,
                args.tokens,
                model.config().context
            ),
        }
        eprintln!("{label}: loaded in {:.2} s", t.elapsed().as_secs_f64());
        variants.push(Variant {
            label,
            model,
            bits_per_weight,
            decode: Vec::new(),
            pipelined: Vec::new(),
            mlp: vec![Vec::new(); args.rows.len()],
            graph: vec![Vec::new(); args.rows.len()],
        });
    }
    let hidden = variants[0].model.config().hidden;
    let inputs = args
        .rows
        .iter()
        .enumerate()
        .map(|(i, &m)| mlx_trellis::random::normal(&[m, hidden], dtype, 0.0, 1.0, i as u64))
        .collect::<mlx_trellis::Result<Vec<_>>>()?;
    eval_all(&inputs.iter().collect::<Vec<_>>())?;

    let start = Instant::now();
    for round in 0..args.rounds {
        for v in &mut variants {
            if round == 0 {
                // The first round compiles every kernel a variant runs (on CUDA, NVRTC: seconds
                // a kernel), so say what it is doing.
                eprintln!("{}: first round (compiles its kernels)", v.label);
            }
            if args.tokens > 0 {
                let tps = decode_round(&v.model, &feed, prompt, args.warmup, args.tokens)
                    .with_context(|| format!("{}: decoding", v.label))?;
                v.decode.push(tps);
                let tps = decode_pipelined_round(&v.model, &feed, prompt, args.warmup, args.tokens)
                    .with_context(|| format!("{}: pipelined decoding", v.label))?;
                v.pipelined.push(tps);
            }
            for (i, x) in inputs.iter().enumerate() {
                if round == 0 {
                    let t = Instant::now();
                    mlp_round(&v.model, x, 1)?; // compiles the kernels of this row count
                    eprintln!(
                        "{}: MLP chain at {} rows warmed up in {:.1} s",
                        v.label,
                        args.rows[i],
                        t.elapsed().as_secs_f64()
                    );
                }
                let (us, graph) = mlp_round(&v.model, x, args.chains)
                    .with_context(|| format!("{}: MLP chain at {} rows", v.label, args.rows[i]))?;
                v.mlp[i].push(us);
                v.graph[i].push(graph);
            }
        }
        let line: Vec<String> = variants
            .iter()
            .map(|v| {
                let d = v.decode.last().map_or(String::new(), |t| format!(" {t:.1} tok/s"));
                let d = d + &v.pipelined.last().map_or(String::new(), |t| format!(" ({t:.1} pipelined)"));
                let m = v.mlp.first().and_then(|r| r.last()).map_or(String::new(), |u| format!(", {u:.1} µs"));
                format!("{}{d}{m}", v.label)
            })
            .collect();
        eprintln!("round {}/{} ({:.0} s): {}", round + 1, args.rounds, start.elapsed().as_secs_f64(), line.join("; "));
    }

    // The reference: the first dense variant (the MLPs' or every layer's), else the first.
    let reference = specs.iter().position(|s| matches!(s.split('|').next(), Some("dense" | "dense-all"))).unwrap_or(0);
    let ref_decode = median(&variants[reference].decode);
    let ref_pipelined = median(&variants[reference].pipelined);
    let ref_mlp: Vec<Option<f64>> = variants[reference].mlp.iter().map(|r| median(r)).collect();
    let ratio = |r: Option<f64>, x: Option<f64>, faster_is_larger: bool| -> String {
        match (r, x) {
            (Some(r), Some(x)) if r > 0.0 && x > 0.0 => {
                format!("{:.2}×", if faster_is_larger { x / r } else { r / x })
            }
            _ => "–".into(),
        }
    };
    let mut header =
        "| variant | MLP bits/weight | decode tokens/s | vs ref | vs ref, per round | pipelined tokens/s | vs ref |"
            .to_string();
    let mut rule = "|---|---|---|---|---|---|---|".to_string();
    for m in args.rows.iter() {
        header += &format!(" MLP µs/layer M={m} | vs ref |");
        rule += "---|---|";
    }
    let mut table = vec![
        format!(
            "{} activations; decode: median of {} rounds of {} steps (per round: the median of each round's ratio); MLP: median µs per layer over {} passes of the model's {} MLPs; ratios against {} (above 1: faster)\n",
            dtype,
            args.rounds,
            args.tokens,
            args.chains,
            variants[0].model.config().layers,
            variants[reference].label
        ),
        header,
        rule,
    ];
    let mut rows = Vec::new();
    for v in &variants {
        let d = median(&v.decode);
        let p = median(&v.pipelined);
        let per_round = median_round_ratio(&variants[reference].decode, &v.decode);
        let mut line = format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            v.label,
            v.bits_per_weight.map_or("–".into(), |b| format!("{b:.3}")),
            d.map_or("–".into(), |d| format!("{d:.1}")),
            ratio(ref_decode, d, true),
            per_round.map_or("–".into(), |r| format!("{r:.2}×")),
            p.map_or("–".into(), |p| format!("{p:.1}")),
            ratio(ref_pipelined, p, true)
        );
        let mut mlp = Vec::new();
        for (i, m) in args.rows.iter().enumerate() {
            let us = median(&v.mlp[i]);
            line += &format!(" {} | {} |", us.map_or("–".into(), |u| format!("{u:.1}")), ratio(ref_mlp[i], us, false));
            mlp.push(serde_json::json!({
                "rows": m, "us_per_layer": us, "rounds": v.mlp[i],
                "graph_us_per_layer": median(&v.graph[i]), "graph_rounds": v.graph[i],
            }));
        }
        table.push(line);
        rows.push(serde_json::json!({
            "label": v.label, "bits_per_weight": v.bits_per_weight, "decode_tokens_per_second": d,
            "decode_rounds": v.decode, "decode_ratio_per_round": per_round, "pipelined_tokens_per_second": p, "pipelined_rounds": v.pipelined, "mlp": mlp, "dtype": dtype.to_string(), "tokens": args.tokens,
            "warmup": args.warmup, "chains": args.chains, "reference": variants[reference].label,
        }));
    }
    table.push(String::new());
    if !args.rows.is_empty() {
        table.push(format!(
            "Host time to build the MLP chain's graph before its evaluation, µs per layer (part of the figures above):\n\n| variant |{}\n|---|{}",
            args.rows.iter().map(|m| format!(" M={m} |")).collect::<String>(),
            "---|".repeat(args.rows.len())
        ));
        for v in &variants {
            let cells: String =
                v.graph.iter().map(|g| format!(" {} |", median(g).map_or("–".into(), |u| format!("{u:.1}")))).collect();
            table.push(format!("| {} |{cells}", v.label));
        }
        table.push(String::new());
    }
    table.push(graphs::note());
    for line in &table {
        println!("{line}");
    }
    if let Some(path) = &args.out.markdown {
        std::fs::write(path, table.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.out.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.out.plot {
        let series: Vec<(String, Vec<(f64, f64)>)> = variants
            .iter()
            .map(|v| {
                let points = args.rows.iter().zip(&v.mlp).filter_map(|(&m, r)| Some((m as f64, median(r)?))).collect();
                (v.label.clone(), points)
            })
            .collect();
        plot::lines(
            &series,
            path,
            &plot::Chart {
                caption: "µs per MLP layer in the model's chain of MLPs",
                x_desc: "activation rows M",
                y_desc: "µs per MLP layer",
                x_log: true,
                y_log: false,
            },
        )
        .with_context(|| format!("plotting {}", path.display()))?;
    }
    Ok(true)
}

fn main() {
    graphs::start();
    let args = Args::parse();
    exit::finish(run(args).context("bench_model"), "bench_model: a check failed")
}
