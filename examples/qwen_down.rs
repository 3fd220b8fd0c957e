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
//! ```
//!
//! Options:
//! - `--weights DIR --module NAME`: run a coded module from a model directory;
//! - `--x FILE`: activations (safetensors, tensor `x`, `[M, in]`, float32 or bfloat16) to run
//!   instead of random ones; `--out FILE` saves the output (tensor `y`, `[M, out]`, x's dtype);
//! - `--path auto|generic|reference|metal|metal-sim|cuda`: force an implementation;
//! - `--rows 1,2,4,8`: activation row counts; `--bits 2|3|4`: which synthetic layer(s);
//! - `--seed N`: seed of the synthetic codes and activations; `--reps N`: timed calls per row.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_trellis::trellis::reference::{forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, Artifact, CodeLayout, ForwardPath, TrellisLinear};
use mlx_trellis::{backend, load_safetensors, save_safetensors, Dtype, MlxArray};

const IN_FEATURES: usize = 17408;
const OUT_FEATURES: usize = 5120;

struct Options {
    weights: Option<String>,
    module: Option<String>,
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
    if o.weights.is_some() != o.module.is_some() {
        bail!("--weights and --module go together");
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

fn to_f64(a: &MlxArray) -> Result<Vec<f64>> {
    let v = a.astype(Dtype::Float32)?.to_vec::<f32>()?;
    let mut out = Vec::new();
    out.try_reserve_exact(v.len()).with_context(|| format!("no memory for {} f64 values", v.len()))?;
    out.extend(v.into_iter().map(f64::from));
    Ok(out)
}

/// The gate's verdict: relErr below `gate` and every output finite (a NaN or infinity in the
/// output fails even where the comparison would not see it).
fn verdict(y: &MlxArray, err: f64, gate: f64) -> Result<(bool, &'static str)> {
    if !y.all_finite()? {
        return Ok((false, "FAIL (non-finite output)"));
    }
    Ok(if err < gate { (true, "ok") } else { (false, "FAIL") })
}

/// The relErr gate for activations of `dtype` (f32 accumulation; output cast to `dtype`).
fn gate(dtype: Dtype) -> f64 {
    if dtype == Dtype::Float32 {
        1e-4
    } else {
        1e-2
    }
}

fn run_given_x(o: &Options, layer: &TrellisLinear, x_file: &str) -> Result<bool> {
    let mut file = load_safetensors(x_file)?;
    let x = file.tensors.remove("x").with_context(|| format!("{x_file} has no tensor \"x\""))?;
    let g = layer.geometry();
    if x.ndim() != 2 || x.shape()[1] != g.in_features() {
        bail!("{x_file}: x has shape {:?}, expected [M, {}]", x.shape(), g.in_features());
    }
    if !matches!(x.dtype(), Dtype::Float32 | Dtype::Bfloat16) {
        bail!("{x_file}: x is {}, expected float32 or bfloat16", x.dtype());
    }
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
    let (ok, status) = verdict(&y, err, gate(x.dtype()))?;
    println!("| M | layout | path | relErr | gate |\n|---|---|---|---|---|");
    println!("| {m} | {} | {} | {err:.2e} | {status} |", layout_name(layer), o.path);
    if let Some(out) = &o.out {
        save_safetensors(out, [("y", &y)], &BTreeMap::new())?;
        progress(&format!("wrote y {:?} {} to {out}", y.shape(), y.dtype()));
    }
    Ok(ok)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    let result = run();
    // Before the process exits, whatever happened: see `mlx_trellis::synchronize`.
    if let Err(e) = mlx_trellis::synchronize() {
        eprintln!("error: {e}");
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("[qwen_down] a result missed its relErr gate");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let o = parse_args()?;
    progress(&format!("MLX back-end: {}", backend()));
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
            let (ok, status) = verdict(&y, err, gate(Dtype::Bfloat16))?;
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
