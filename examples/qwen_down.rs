//! One Qwen MLP down projection (17408 inputs -> 5120 outputs) through a trellis-coded layer.
//!
//! By default it builds seeded synthetic layers of that shape, 3-bit in the block-interleaved
//! layout and 2-bit row-major, runs M = 1, 2, 4, 8 rows of bf16 activations through the best
//! path the back-end offers, checks every result against the f64 reference (relErr gated) and
//! prints a table. Exit status 0 means every check passed.
//!
//! ```text
//! cargo run --release --example qwen_down
//! cargo run --release --example qwen_down -- --path generic --rows 1,4 --bits 3
//! cargo run --release --example qwen_down -- --weights DIR --module model.layers.0.mlp.down_proj
//! cargo run --release --example qwen_down -- --weights DIR --module NAME --x x.safetensors --out y.safetensors
//! cargo run --release --example qwen_down -- --weights DIR --mlp model.layers.0.mlp --x x.safetensors --out y.safetensors
//! ```
//!
//! `--help` lists every option.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::trellis::reference::{forward_f64, mlp_forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, Artifact, CodeLayout, ForwardPath, TrellisLinear, TrellisMlp};
use mlx_trellis::{backend, load_safetensors, save_safetensors, Dtype, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;

use check::{to_f64, verdict};

const IN_FEATURES: usize = 17408;
const OUT_FEATURES: usize = 5120;

/// One Qwen MLP down projection (17408 -> 5120) through a trellis-coded layer, checked against
/// the f64 reference.
///
/// By default it builds seeded synthetic layers of that shape (3-bit block-interleaved and 2-bit
/// row-major), runs each --rows count of bf16 activations through the best path the back-end
/// offers, checks every result against the f64 reference (relErr = max|a-b| / max|b|, gated at
/// 1e-2 for bf16, 1e-4 for f32) and prints a table. Exit status: 0 every check passed, 1 a result
/// missed its gate, 2 an error.
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo run --release --example qwen_down
  cargo run --release --example qwen_down -- --path generic --rows 1,4 --bits 3
  cargo run --release --example qwen_down -- --weights DIR --module model.layers.0.mlp.down_proj
  cargo run --release --example qwen_down -- --weights DIR --module NAME --x x.safetensors --out y.safetensors
  cargo run --release --example qwen_down -- --weights DIR --mlp model.layers.0.mlp --x x.safetensors --out y.safetensors")]
struct Options {
    /// A model directory (config.json and safetensors) to run a coded module or MLP from; goes
    /// with --module or --mlp
    #[arg(long, value_name = "DIR")]
    weights: Option<String>,
    /// The coded module of --weights to run
    #[arg(long, value_name = "NAME", requires = "weights", conflicts_with = "mlp")]
    module: Option<String>,
    /// The coded MLP PREFIX.{gate,up,down}_proj of --weights to run, down(silu(gate(x)) * up(x)),
    /// checked against the f64 reference of all three (quantize_mlp writes one)
    #[arg(long, value_name = "PREFIX", requires = "weights")]
    mlp: Option<String>,
    /// Activations to run instead of seeded ones: safetensors, tensor `x` [M, in], float32 or
    /// bfloat16
    #[arg(long, value_name = "FILE")]
    x: Option<String>,
    /// Save the output (tensor `y` [M, out], x's dtype) to this safetensors file
    #[arg(long, value_name = "FILE", requires = "x")]
    out: Option<String>,
    #[command(flatten)]
    path: cli::PathArg,
    /// Activation row counts (M), comma-separated
    #[arg(long, value_name = "M,...", value_delimiter = ',', value_parser = cli::positive,
          default_value = "1,2,4,8")]
    rows: Vec<usize>,
    /// Only the synthetic layer of this width: 2 or 4 (row-major) or 3 (interleaved) [default:
    /// k 3 and k 2]
    #[arg(long, value_name = "K", value_parser = cli::bits)]
    bits: Option<u32>,
    #[command(flatten)]
    seed: cli::SeedArg,
    /// Timed calls per row count [default: 20 on a GPU; none on the CPU or the reference and
    /// simulator paths, where the checked call is the timing]
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
}

fn parse_args() -> Result<Options> {
    let o = Options::parse();
    if o.weights.is_some() && o.module.is_none() && o.mlp.is_none() {
        bail!("--weights goes with --module NAME or --mlp PREFIX");
    }
    Ok(o)
}

fn progress(msg: &str) {
    eprintln!("[qwen_down] {msg}");
}

/// Runs `f` and reports how long it took.
fn step<T, E: Into<anyhow::Error>>(what: &str, f: impl FnOnce() -> std::result::Result<T, E>) -> Result<T> {
    progress(&format!("{what} ..."));
    let t = Instant::now();
    let v = f().map_err(Into::into)?;
    progress(&format!("{what}: {:.2} s", t.elapsed().as_secs_f64()));
    Ok(v)
}

fn layers(o: &Options) -> Result<Vec<TrellisLinear>> {
    if let (Some(dir), Some(module)) = (&o.weights, &o.module) {
        let art = Artifact::open(dir)?;
        return Ok(vec![step(&format!("loading {module} from {dir}"), || art.module(module))?]);
    }
    let mut specs = vec![(3, CodeLayout::K3Interleaved), (2, CodeLayout::RowMajor)];
    if let Some(k) = o.bits {
        specs = match k {
            3 => vec![(3, CodeLayout::K3Interleaved)],
            2 | 4 => vec![(k, CodeLayout::RowMajor)],
            _ => bail!("--bits: synthetic layers are 2, 3 or 4 bits"),
        };
    }
    specs
        .into_iter()
        .map(|(k, layout)| {
            step(&format!("building a synthetic {IN_FEATURES} -> {OUT_FEATURES} layer, k = {k}, {layout:?}"), || {
                let h = synthetic_layer(
                    IN_FEATURES,
                    OUT_FEATURES,
                    k,
                    12,
                    0,
                    layout,
                    0.015,
                    o.seed.seed.wrapping_add(k as u64),
                )?;
                TrellisLinear::from_host(&format!("synthetic.k{k}.down_proj"), &h)
            })
        })
        .collect()
}

fn layout_name(l: &TrellisLinear) -> String {
    let g = l.geometry();
    match g.layout() {
        CodeLayout::K3Interleaved => format!("k{} interleaved", g.k),
        CodeLayout::RowMajor => format!("k{} row-major", g.k),
    }
}

/// The relErr gate for activations of `dtype` (f32 accumulation; output cast to `dtype`).
fn gate_for(dtype: Dtype) -> f64 {
    if dtype == Dtype::Float32 {
        1e-4
    } else {
        1e-2
    }
}

fn run_given_x(o: &Options, layer: &TrellisLinear, x_file: &str) -> Result<bool> {
    let g = layer.geometry();
    let x = read_x(x_file, g.in_features())?;
    let m = x.shape()[0];
    let y = step(&format!("running {} rows by the {} path", m, o.path.path), || -> mlx_trellis::Result<_> {
        let y = layer.forward_with(&x, o.path.path)?;
        y.eval()?;
        Ok(y)
    })?;
    let host = layer.to_host()?;
    let want =
        step("f64 reference", || -> Result<_> { Ok(forward_f64(&to_f64(&x)?, m, &host.codes, &host.scales, g)?) })?;
    let err = rel_err(&to_f64(&y)?, &want)?;
    let (ok, status) = verdict(&y, err, gate_for(x.dtype()))?;
    println!("| M | layout | path | relErr | gate |\n|---|---|---|---|---|");
    println!("| {m} | {} | {} | {err:.2e} | {status} |", layout_name(layer), o.path.path);
    if let Some(out) = &o.out {
        save_safetensors(out, [("y", &y)], &BTreeMap::new())?;
        progress(&format!("wrote y {:?} {} to {out}", y.shape(), y.dtype()));
    }
    Ok(ok)
}

/// Reads the activations `[M, width]` (f32 or bf16) of tensor `x` in `x_file`.
fn read_x(x_file: &str, width: usize) -> Result<MlxArray> {
    let mut file = load_safetensors(x_file)?;
    let x = file.tensors.remove("x").with_context(|| format!("{x_file} has no tensor \"x\""))?;
    if x.ndim() != 2 || x.shape()[1] != width {
        bail!("{x_file}: x has shape {:?}, expected [M, {width}]", x.shape());
    }
    if !matches!(x.dtype(), Dtype::Float32 | Dtype::Bfloat16) {
        bail!("{x_file}: x is {}, expected float32 or bfloat16", x.dtype());
    }
    Ok(x)
}

/// Runs a coded MLP on the given activations (`--x`) or on seeded bf16 ones of each `--rows`
/// count, each result checked against the f64 reference of the three projections.
fn run_mlp(o: &Options, mlp: &TrellisMlp) -> Result<bool> {
    let hidden = mlp.hidden();
    let (gate, up, down) = (mlp.gate().to_host()?, mlp.up().to_host()?, mlp.down().to_host()?);
    // Seeded rows: one reference run for the largest M serves every M (rows are independent).
    let (inputs, want_all): (Vec<MlxArray>, Option<Vec<f64>>) = match &o.x {
        Some(file) => (vec![read_x(file, hidden)?], None),
        None => {
            let max_m = *o.rows.iter().max().expect("at least one row count");
            let n = max_m.checked_mul(hidden).context("--rows: the activations' size overflows")?;
            let x_all =
                MlxArray::from_slice(&gaussian(n, o.seed.seed ^ 0x5eed)?, &[max_m, hidden])?.astype(Dtype::Bfloat16)?;
            let want = step(&format!("f64 reference ({max_m} rows)"), || -> Result<_> {
                Ok(mlp_forward_f64(&to_f64(&x_all)?, max_m, &gate, &up, &down)?)
            })?;
            let inputs = o
                .rows
                .iter()
                .map(|&m| x_all.slice(&[0, 0], &[m as i32, hidden as i32], &[1, 1]))
                .collect::<mlx_trellis::Result<_>>()?;
            (inputs, Some(want))
        }
    };
    let path = if o.path.path == ForwardPath::Auto { mlp.best_path() } else { o.path.path };
    println!(
        "
MLP {hidden} -> {} -> {hidden}, MLX back-end {}",
        mlp.intermediate(),
        backend()
    );
    println!(
        "| M | dtype | path | relErr | gate |
|---|---|---|---|---|"
    );
    let mut all_ok = true;
    for x in &inputs {
        let m = x.shape()[0];
        let y = step(&format!("MLP, {m} rows by the {path} path"), || -> mlx_trellis::Result<_> {
            let y = mlp.forward_with(x, path)?;
            y.eval()?;
            Ok(y)
        })?;
        let given;
        let want: &[f64] = match &want_all {
            Some(all) => &all[..m * hidden],
            None => {
                given =
                    step("f64 reference", || -> Result<_> { Ok(mlp_forward_f64(&to_f64(x)?, m, &gate, &up, &down)?) })?;
                &given
            }
        };
        let err = rel_err(&to_f64(&y)?, want)?;
        let (ok, status) = verdict(&y, err, gate_for(x.dtype()))?;
        all_ok &= ok;
        println!("| {m} | {} | {path} | {err:.2e} | {status} |", x.dtype());
        if let Some(out) = &o.out {
            save_safetensors(out, [("y", &y)], &BTreeMap::new())?;
            progress(&format!("wrote y {:?} {} to {out}", y.shape(), y.dtype()));
        }
    }
    Ok(all_ok)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    exit::finish(run(), "[qwen_down] a result missed its relErr gate")
}

fn run() -> Result<bool> {
    let o = parse_args()?;
    progress(&format!("MLX back-end: {}", backend()));
    if let (Some(dir), Some(prefix)) = (&o.weights, &o.mlp) {
        let art = Artifact::open(dir)?;
        let mlp = step(&format!("loading the MLP {prefix} from {dir}"), || TrellisMlp::from_artifact(&art, prefix))?;
        return run_mlp(&o, &mlp);
    }
    let layers = layers(&o)?;
    if let Some(x) = &o.x {
        return run_given_x(&o, &layers[0], x);
    }
    let max_m = *o.rows.iter().max().expect("at least one row count");
    let mut all_ok = true;
    let mut table = Vec::new();
    for layer in &layers {
        let g = layer.geometry();
        let n = max_m.checked_mul(g.in_features()).context("--rows: the activations' size overflows")?;
        let xs = gaussian(n, o.seed.seed ^ 0x5eed)?;
        let x_all = MlxArray::from_slice(&xs, &[max_m, g.in_features()])?.astype(Dtype::Bfloat16)?;
        let host = layer.to_host()?;
        // One reference run for the largest M serves every M (rows are independent).
        let want = step(&format!("f64 reference for {} ({} rows)", layout_name(layer), max_m), || -> Result<_> {
            Ok(forward_f64(&to_f64(&x_all)?, max_m, &host.codes, &host.scales, g)?)
        })?;
        for &m in &o.rows {
            let x = x_all.slice(&[0, 0], &[m as i32, g.in_features() as i32], &[1, 1])?;
            x.eval()?;
            let path = if o.path.path == ForwardPath::Auto { layer.best_path() } else { o.path.path };
            // On the GPU the first call compiles kernels and warms caches and is not timed; on
            // the CPU (seconds per call) the first call is the timing.
            let slow = backend() == mlx_trellis::Backend::Cpu
                || matches!(path, ForwardPath::Reference | ForwardPath::MetalSim);
            let first = Instant::now();
            let y = step(
                &format!("{} M = {m}: first call by the {path} path", layout_name(layer)),
                || -> mlx_trellis::Result<_> {
                    let y = layer.forward_with(&x, path)?;
                    y.eval()?;
                    Ok(y)
                },
            )?;
            let mut times = vec![first.elapsed().as_secs_f64() * 1e3];
            let err = rel_err(&to_f64(&y)?, &want[..m * g.out_features()])?;
            let (ok, status) = verdict(&y, err, gate_for(Dtype::Bfloat16))?;
            all_ok &= ok;
            let reps = o.reps.unwrap_or(if slow { 0 } else { 20 });
            if reps > 0 {
                times.clear();
            }
            for _ in 0..reps {
                let t = Instant::now();
                layer.forward_with(&x, path)?.eval()?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let reps = times.len();
            table.push(format!(
                "| {m} | {} | {path} | {:.3} | {reps} | {err:.2e} | {status} |",
                layout_name(layer),
                median(times),
            ));
        }
    }
    println!("\nQwen down projection {IN_FEATURES} -> {OUT_FEATURES}, bf16 activations, MLX back-end {}", backend());
    println!("| M | layout | path | median ms | calls | relErr | gate (1e-2) |");
    println!("|---|---|---|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
    Ok(all_ok)
}
