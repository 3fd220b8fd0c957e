//! The Qwen3-14B MLP (5120 -> 17408 -> 5120) split across processes by tensor parallelism, checked
//! against one process.
//!
//! It writes seeded synthetic coded MLP layers as a model artifact (or takes `--weights DIR`),
//! runs the residual chain `x <- x + mlp_l(x)` over the layers in this process with every layer
//! whole, then starts `--tp N` processes of itself as one MLX distributed group on this machine
//! (`mlx_trellis::distributed::launcher`). Each loads only its rows of each layer from the safetensors file,
//! times the same chain with one all-reduce per layer, and runs each layer `l` once more on the
//! one process's input of layer `l`, writing those outputs back. This process prints the
//! per-layer time of each and the relErr of every rank's layer outputs against its own, layer by
//! layer on the same input, so rounding does not compound along the chain (gate: 1e-4 for f32
//! activations; for bf16 (N + 1) · 2^-8, at least 1e-2: each rank's partial and each addition of
//! the all-reduce rounds to bf16); exit status 0 means every check passed.
//!
//! ```text
//! cargo run --release --example qwen_mlp -- --tp 2                       # ring on the CPU
//! cargo run --release --example qwen_mlp -- --tp 2 --hidden 1024 --inter 2048   # small and quick
//! target/release/examples/qwen_mlp --tp 1 --backend nccl                 # one NCCL rank (CUDA build)
//! target/release/examples/qwen_mlp --tp 4 --backend nccl --rows 8        # four GPUs
//! ```
//!
//! `--help` lists every option.

#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use mlx_trellis::distributed::launcher as tp;
use mlx_trellis::distributed::{bf16_tp_gate, is_available, CollectiveBackend, ShardedMlp};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_mlp, write_artifact, Artifact, CodeLayout, TrellisLinear, TrellisMlp};
use mlx_trellis::{backend, eval_all, load_safetensors, save_safetensors, Dtype, MlxArray};

/// The Qwen3-14B MLP (5120 -> 17408 -> 5120) split across processes by tensor parallelism,
/// checked against one process.
///
/// It writes seeded synthetic coded MLP layers as a model artifact (or takes --weights), runs the
/// residual chain x <- x + mlp_l(x) over them in this process with every layer whole, then starts
/// --tp processes of itself as one MLX distributed group on this machine. Each loads only its
/// rows of each layer, times the same chain with one all-reduce per layer, and runs each layer l
/// once more on the one process's input of layer l. The table gives the per-layer time of both,
/// the all-reduce alone, and every rank's relErr per layer against the one process on the same
/// input (gate: 1e-4 for f32 activations; (N + 1) * 2^-8, at least 1e-2, for bf16). Exit status:
/// 0 every check passed, 1 a result missed its gate, 2 an error.
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo run --release --example qwen_mlp -- --tp 2                              # ring on the CPU
  cargo run --release --example qwen_mlp -- --tp 2 --hidden 1024 --inter 2048   # small and quick
  target/release/examples/qwen_mlp --tp 1 --backend nccl                        # one NCCL rank (CUDA build)
  target/release/examples/qwen_mlp --tp 4 --backend nccl --rows 8               # four GPUs
  target/release/examples/qwen_mlp --probe")]
struct Options {
    /// Processes (ranks) of the group
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value_t = 2)]
    tp: usize,
    /// Distributed back-end: any (NCCL on MLX's CUDA build when it has it, else the ring over
    /// 127.0.0.1), ring or nccl
    #[arg(long, value_name = "BACKEND", default_value = "any")]
    backend: CollectiveBackend,
    /// Bits per weight of the synthetic layers (3 puts the down projection in the block
    /// interleave)
    #[arg(long, value_name = "K", value_parser = cli::bits, default_value_t = 3)]
    bits: u32,
    /// MLP layers in the chain
    #[arg(long, value_name = "L", value_parser = cli::positive, default_value_t = 2)]
    layers: usize,
    /// Activation rows (M)
    #[arg(long, value_name = "M", value_parser = cli::positive, default_value_t = 1)]
    rows: usize,
    /// Activation dtype: bf16 or f32
    #[arg(long, value_name = "DTYPE", value_parser = activation_dtype, default_value = "bf16")]
    dtype: Dtype,
    /// Timed evaluations after the checked one [default: 5 on a GPU; none on the CPU, where the
    /// checked evaluation is timed]
    #[arg(long, value_name = "E")]
    evals: Option<usize>,
    #[command(flatten)]
    path: cli::PathArg,
    /// Hidden width of the synthetic layers
    #[arg(long, value_name = "H", value_parser = cli::positive, default_value_t = 5120)]
    hidden: usize,
    /// Intermediate width of the synthetic layers
    #[arg(long, value_name = "I", value_parser = cli::positive, default_value_t = 17408)]
    inter: usize,
    #[command(flatten)]
    seed: cli::SeedArg,
    /// A model directory with model.layers.{0..L}.mlp.{gate,up,down}_proj instead of synthetic
    /// layers
    #[arg(long, value_name = "DIR")]
    weights: Option<PathBuf>,
    /// The launch's watchdog: every rank still running after this many seconds is stopped
    #[arg(long, value_name = "SECONDS", default_value_t = 900)]
    timeout: u64,
    /// Print MLX's back-end and which distributed back-ends it has, and exit
    #[arg(long)]
    probe: bool,
}

/// `--dtype bf16|f32`.
fn activation_dtype(s: &str) -> Result<Dtype, String> {
    match cli::float_dtype(s)? {
        Dtype::Float16 => Err("bf16 or f32".into()),
        d => Ok(d),
    }
}

fn parse_args() -> Result<Options> {
    Ok(Options::parse())
}

fn progress(msg: &str) {
    eprintln!("[qwen_mlp] {msg}");
}

fn prefix(l: usize) -> String {
    format!("model.layers.{l}.mlp")
}

fn to_f64(a: &MlxArray) -> Result<Vec<f64>> {
    Ok(a.astype(Dtype::Float32)?.to_vec::<f32>()?.into_iter().map(f64::from).collect())
}

/// The activations every process uses: seeded, so each builds the same bits.
fn activations(o: &Options, hidden: usize) -> Result<MlxArray> {
    Ok(MlxArray::from_slice(&gaussian(o.rows * hidden, o.seed.seed ^ 0xacc)?, &[o.rows, hidden])?.astype(o.dtype)?)
}

/// The residual chain `x <- x + mlp_l(x)`: each layer's output, and the final `x`.
fn chain(
    x: &MlxArray,
    layers: usize,
    mlp: &dyn Fn(usize, &MlxArray) -> mlx_trellis::Result<MlxArray>,
) -> Result<Vec<MlxArray>> {
    let mut x = x.clone();
    let mut outs = Vec::new();
    for l in 0..layers {
        let y = mlp(l, &x)?;
        x = x.add(&y)?;
        outs.push(y);
    }
    outs.push(x);
    Ok(outs)
}

/// The chain's outputs, evaluated, and its median and best milliseconds per layer: the first
/// evaluation is the check's (and a warm-up on a GPU, where it compiles kernels), then `evals`
/// more (by default none on the CPU, where one evaluation takes seconds, and 5 elsewhere).
fn timed_chain(
    o: &Options,
    x: &MlxArray,
    mlp: &dyn Fn(usize, &MlxArray) -> mlx_trellis::Result<MlxArray>,
) -> Result<(Vec<MlxArray>, f64, f64)> {
    let once = |keep: &mut Option<Vec<MlxArray>>| -> Result<f64> {
        let outs = chain(x, o.layers, mlp)?;
        let t = Instant::now();
        eval_all(&outs.iter().collect::<Vec<_>>())?;
        let ms = t.elapsed().as_secs_f64() * 1e3 / o.layers as f64;
        keep.get_or_insert(outs);
        Ok(ms)
    };
    let mut outs = None;
    let first = once(&mut outs)?;
    let cpu = backend() == mlx_trellis::Backend::Cpu;
    let evals = o.evals.unwrap_or(if cpu { 0 } else { 5 });
    let mut v = (0..evals).map(|_| once(&mut None)).collect::<Result<Vec<_>>>()?;
    if v.is_empty() {
        v.push(first);
    }
    v.sort_by(f64::total_cmp);
    Ok((outs.expect("evaluated once"), v[v.len() / 2], v[0]))
}

/// Writes `layers` seeded synthetic MLPs to `dir` as one artifact.
fn write_synthetic(o: &Options, dir: &Path) -> Result<()> {
    let layout = if o.bits == 3 { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor };
    let mut names = Vec::new();
    let mut layers = Vec::new();
    for l in 0..o.layers {
        let h =
            synthetic_mlp(o.hidden, o.inter, o.bits, layout, o.seed.seed.wrapping_add(1000 * l as u64 + o.bits as u64))
                .with_context(|| {
                    format!("synthetic layers of --hidden {} --inter {} --bits {}", o.hidden, o.inter, o.bits)
                })?;
        for (name, host) in [("gate_proj", &h.0), ("up_proj", &h.1), ("down_proj", &h.2)] {
            let module = format!("{}.{name}", prefix(l));
            layers.push(TrellisLinear::from_host(&module, host)?);
            names.push(module);
        }
    }
    let modules: Vec<(&str, &TrellisLinear)> = names.iter().map(String::as_str).zip(&layers).collect();
    let extra = [("hidden_size", serde_json::json!(o.hidden)), ("intermediate_size", serde_json::json!(o.inter))];
    write_artifact(dir, &modules, &extra)?;
    Ok(())
}

/// One rank: its shard of every layer (its rows alone read from disk), the chain, its timings.
fn rank_main(o: &Options, joined: mlx_trellis::Result<(mlx_trellis::distributed::Group, PathBuf)>) -> Result<()> {
    let (group, out) = joined?;
    let group = Rc::new(group);
    let (rank, n) = (group.rank(), group.size());
    let dir = std::env::var("QWEN_MLP_MODEL").context("QWEN_MLP_MODEL (set by the parent process)")?;
    let art = Artifact::open(&dir)?;
    let t = Instant::now();
    let layers: Vec<ShardedMlp> = (0..o.layers)
        .map(|l| ShardedMlp::from_artifact(&art, &prefix(l), group.clone()))
        .collect::<mlx_trellis::Result<_>>()?;
    let load_s = t.elapsed().as_secs_f64();
    let x = activations(o, layers[0].local().hidden())?;
    let (outs, median, best) = timed_chain(o, &x, &|l, x| layers[l].forward(x, o.path.path))?;
    // The all-reduce alone: a chain of as many, on arrays of the MLP output's shape.
    let (_, ar_median, _) = timed_chain(o, &x, &|_, x| x.all_sum(&group))?;
    // The check: each layer on the one process's input of that layer.
    let inputs_file = std::env::var("QWEN_MLP_INPUTS").context("QWEN_MLP_INPUTS (set by the parent process)")?;
    let inputs = load_safetensors(&inputs_file)?;
    let mut checked = Vec::with_capacity(o.layers);
    for (l, layer) in layers.iter().enumerate() {
        let x_l = inputs.tensors.get(&format!("x{l}")).with_context(|| format!("{inputs_file} has no x{l}"))?;
        checked.push(layer.forward(x_l, o.path.path)?);
    }
    let mut names: Vec<String> = (0..o.layers).map(|l| format!("y{l}")).collect();
    names.push("chain".into());
    let results: Vec<&MlxArray> = checked.iter().chain(outs.last()).collect();
    let tensors: Vec<(&str, &MlxArray)> = names.iter().map(String::as_str).zip(results).collect();
    let meta = BTreeMap::from([
        ("load_s".to_string(), format!("{load_s:.3}")),
        ("median_ms".to_string(), format!("{median:.4}")),
        ("best_ms".to_string(), format!("{best:.4}")),
        ("allreduce_ms".to_string(), format!("{ar_median:.4}")),
        ("group".to_string(), format!("{:?}", *group)),
    ]);
    save_safetensors(out.join(format!("rank{rank}.safetensors")), tensors, &meta)?;
    progress(&format!("rank {rank} of {n}: done ({:?})", *group));
    Ok(())
}

fn parent(o: &Options) -> Result<bool> {
    progress(&format!("MLX back-end: {}", backend()));
    // What an earlier run killed outright left behind.
    tp::remove_stale_dirs("qwen_mlp");
    let scratch = std::env::temp_dir().join(format!("qwen_mlp-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    // Removed on every way out; a --weights directory is never touched.
    let _scratch = tp::TempDir(scratch.clone());
    let dir = match &o.weights {
        Some(d) => d.clone(),
        None => {
            let t = Instant::now();
            let model = scratch.join("model");
            write_synthetic(o, &model)?;
            progress(&format!(
                "wrote {} synthetic layers to {} in {:.1} s",
                o.layers,
                model.display(),
                t.elapsed().as_secs_f64()
            ));
            model
        }
    };
    run_parent(o, &dir, &scratch)
}

fn run_parent(o: &Options, dir: &Path, scratch: &Path) -> Result<bool> {
    let art = Artifact::open(dir)?;
    let whole: Vec<TrellisMlp> =
        (0..o.layers).map(|l| TrellisMlp::from_artifact(&art, &prefix(l))).collect::<mlx_trellis::Result<_>>()?;
    let (hidden, inter) = (whole[0].hidden(), whole[0].intermediate());
    let x = activations(o, hidden)?;
    let (want, one_median, one_best) = timed_chain(o, &x, &|l, x| whole[l].forward_with(x, o.path.path))?;
    progress(&format!("one process: {one_median:.3} ms per layer"));
    drop(whole);
    // Layer l's input in the one process's chain: x, then x + y_0, ...
    let mut chain_inputs = vec![x.clone()];
    for y in &want[..o.layers - 1] {
        chain_inputs.push(chain_inputs.last().expect("one input").add(y)?);
    }
    let input_names: Vec<String> = (0..o.layers).map(|l| format!("x{l}")).collect();
    let inputs_file = scratch.join("inputs.safetensors");
    save_safetensors(&inputs_file, input_names.iter().map(String::as_str).zip(&chain_inputs), &BTreeMap::new())?;

    let launch = tp::Launch::new(o.tp, o.backend, Duration::from_secs(o.timeout));
    let exe = std::env::current_exe()?;
    let dir_s = dir.display().to_string();
    let report = tp::run(&launch, &|_| {
        let mut c = Command::new(&exe);
        c.args(std::env::args().skip(1)).env("QWEN_MLP_MODEL", &dir_s).env("QWEN_MLP_INPUTS", &inputs_file);
        c
    })?;
    report.check()?;
    let gate = if o.dtype == Dtype::Float32 { 1e-4 } else { bf16_tp_gate(o.tp) };
    let mut ok = true;
    let mut errs = vec![0f64; o.layers];
    let mut rank0 = BTreeMap::new();
    for r in 0..o.tp {
        let file = load_safetensors(report.out.join(format!("rank{r}.safetensors")))?;
        for (l, e) in errs.iter_mut().enumerate() {
            let y = file.tensors.get(&format!("y{l}")).with_context(|| format!("rank {r} wrote no y{l}"))?;
            let err = rel_err(&to_f64(y)?, &to_f64(&want[l])?)?;
            ok &= err < gate && y.all_finite()?;
            *e = e.max(err);
        }
        if r == 0 {
            rank0 = file.metadata;
        }
    }
    let ms = |k: &str| rank0.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    println!(
        "\nQwen MLP {hidden} -> {inter} -> {hidden}, k{}, {} layers, M = {} {}, path {}, MLX back-end {}",
        o.bits,
        o.layers,
        o.rows,
        o.dtype,
        o.path.path,
        backend()
    );
    println!(
        "TP {} over {} ({}); each rank loaded its rows of every layer in {} s",
        o.tp,
        report.backend,
        rank0.get("group").map_or("?", |s| s.as_str()),
        rank0.get("load_s").map_or("?", |s| s.as_str())
    );
    println!("\n| per layer | median ms | best ms |\n|---|---|---|");
    println!("| one process, whole layers | {one_median:.3} | {one_best:.3} |");
    println!("| TP {} rank 0 (shard + all-reduce) | {:.3} | {:.3} |", o.tp, ms("median_ms"), ms("best_ms"));
    println!("| TP {} rank 0, the all-reduce alone | {:.3} | |", o.tp, ms("allreduce_ms"));
    println!(
        "\n| layer | relErr, every rank against one process on the same input (max) | gate {gate:.2e} |\n|---|---|---|"
    );
    for (l, e) in errs.iter().enumerate() {
        println!("| {l} | {e:.2e} | {} |", if *e < gate { "ok" } else { "FAIL" });
    }
    Ok(ok)
}

fn run() -> Result<bool> {
    let o = parse_args()?;
    if o.probe {
        let have: Vec<String> = [CollectiveBackend::Ring, CollectiveBackend::Nccl, CollectiveBackend::Mpi]
            .iter()
            .map(|&b| format!("{b} {}", if is_available(b) { "yes" } else { "no" }))
            .collect();
        println!("MLX back-end {}; distributed back-ends: {}", backend(), have.join(", "));
        return Ok(true);
    }
    if let Some(joined) = tp::rank_group() {
        rank_main(&o, joined)?;
        return Ok(true);
    }
    parent(&o)
}

fn main() -> ExitCode {
    exit::finish(run(), "[qwen_mlp] a result missed its relErr gate")
}
