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
//! Options:
//! - `--weights DIR --module NAME`: run a coded module from a model directory;
//! - `--weights DIR --mlp PREFIX`: run the coded MLP `PREFIX.{gate,up,down}_proj` instead
//!   (`down(silu(gate(x)) ⊙ up(x))`, checked against the f64 reference of all three; the
//!   `quantize_mlp` example writes one);
//! - `--x FILE`: activations (safetensors, tensor `x`, `[M, in]`, float32 or bfloat16) to run
//!   instead of random ones; `--out FILE` saves the output (tensor `y`, `[M, out]`, x's dtype);
//! - `--path auto|generic|reference|metal|metal-sim|cuda`: force an implementation;
//! - `--rows 1,2,4,8`: activation row counts; `--bits 2|3|4`: which synthetic layer(s);
//! - `--seed N`: seed of the synthetic codes and activations; `--reps N`: timed calls per row.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_trellis::trellis::reference::{forward_f64, mlp_forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, Artifact, CodeLayout, ForwardPath, TrellisLinear, TrellisMlp};
use mlx_trellis::{backend, load_safetensors, save_safetensors, Dtype, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/exit.rs"]
mod exit;

use check::{to_f64, verdict};

const IN_FEATURES: usize = 17408;
const OUT_FEATURES: usize = 5120;

struct Options {
    weights: Option<String>,
    module: Option<String>,
    mlp: Option<String>,
    x: Option<String>,
    out: Option<String>,
    path: ForwardPath,
    rows: Vec<usize>,
    bits: Option<u32>,
    seed: u64,
    reps: Option<usize>,
}

fn parse_args() -> Result<Options> {
    let mut o = Options {
        weights: None,
        module: None,
        mlp: None,
        x: None,
        out: None,
        path: ForwardPath::Auto,
        rows: vec![1, 2, 4, 8],
        bits: None,
        seed: 0,
        reps: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--weights" => o.weights = Some(value()?),
            "--module" => o.module = Some(value()?),
            "--mlp" => o.mlp = Some(value()?),
            "--x" => o.x = Some(value()?),
            "--out" => o.out = Some(value()?),
            "--path" => o.path = value()?.parse()?,
            "--rows" => {
                o.rows = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().with_context(|| format!("--rows: {s:?} is not a row count")))
                    .collect::<Result<_>>()?;
                if o.rows.contains(&0) {
                    bail!("--rows: row counts start at 1");
                }
            }
            "--bits" => o.bits = Some(value()?.parse().context("--bits takes 2, 3 or 4")?),
            "--seed" => o.seed = value()?.parse().context("--seed takes an integer")?,
            "--reps" => o.reps = Some(value()?.parse().context("--reps takes an integer")?),
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("qwen_down.rs")
                        .lines()
                        .take_while(|l| l.starts_with("//!"))
                        .map(|l| l.trim_start_matches("//!").trim_start())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                std::process::exit(0);
            }
            other => bail!("unknown option {other:?} (see --help)"),
        }
    }
    if o.module.is_some() && o.mlp.is_some() {
        bail!("--module and --mlp are exclusive: one module or one MLP");
    }
    if o.weights.is_some() != (o.module.is_some() || o.mlp.is_some()) {
        bail!("--weights goes with --module NAME or --mlp PREFIX");
    }
    if o.out.is_some() && o.x.is_none() {
        bail!("--out needs --x");
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
                let h =
                    synthetic_layer(IN_FEATURES, OUT_FEATURES, k, 12, 0, layout, 0.015, o.seed.wrapping_add(k as u64))?;
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
    let y = step(&format!("running {} rows by the {} path", m, o.path), || -> mlx_trellis::Result<_> {
        let y = layer.forward_with(&x, o.path)?;
        y.eval()?;
        Ok(y)
    })?;
    let host = layer.to_host()?;
    let want =
        step("f64 reference", || -> Result<_> { Ok(forward_f64(&to_f64(&x)?, m, &host.codes, &host.scales, g)?) })?;
    let err = rel_err(&to_f64(&y)?, &want)?;
    let (ok, status) = verdict(&y, err, gate_for(x.dtype()))?;
    println!("| M | layout | path | relErr | gate |\n|---|---|---|---|---|");
    println!("| {m} | {} | {} | {err:.2e} | {status} |", layout_name(layer), o.path);
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
                MlxArray::from_slice(&gaussian(n, o.seed ^ 0x5eed)?, &[max_m, hidden])?.astype(Dtype::Bfloat16)?;
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
    let path = if o.path == ForwardPath::Auto { mlp.best_path() } else { o.path };
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
        let xs = gaussian(n, o.seed ^ 0x5eed)?;
        let x_all = MlxArray::from_slice(&xs, &[max_m, g.in_features()])?.astype(Dtype::Bfloat16)?;
        let host = layer.to_host()?;
        // One reference run for the largest M serves every M (rows are independent).
        let want = step(&format!("f64 reference for {} ({} rows)", layout_name(layer), max_m), || -> Result<_> {
            Ok(forward_f64(&to_f64(&x_all)?, max_m, &host.codes, &host.scales, g)?)
        })?;
        for &m in &o.rows {
            let x = x_all.slice(&[0, 0], &[m as i32, g.in_features() as i32], &[1, 1])?;
            x.eval()?;
            let path = if o.path == ForwardPath::Auto { layer.best_path() } else { o.path };
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
