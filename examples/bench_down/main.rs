//! Benchmark of the Qwen down projection (17408 -> 5120; `--shape IN,OUT` for another axis-0
//! layer) on a GPU back-end: the trellis kernels against MLX's dense bf16 matmul of the same
//! decoded layer and MLX's affine `quantized_matmul` of it at 4 and 3 bits (group 64), all in one
//! run.
//!
//! Every figure is per call: `--calls` calls (default 20) are queued and evaluated together, and
//! the median and best of `--evals` evaluations (default 30) are reported. Activations are bf16.
//! Each trellis result is checked against the f64 reference (relErr = max|a-b| / max|b|): after
//! the table, a relErr of 1e-2 or more or a non-finite output fails the run (exit status 1; 2 is
//! an error).
//!
//! `--help` lists every option, with examples.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::trellis::cuda::down::uses_dense;
use mlx_trellis::trellis::cuda::tuning::{parse_down_configs, plan, CudaDownConfig};
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, CodeLayout, ForwardPath, HostLayer, TrellisLinear};
use mlx_trellis::{backend, eval_all, quantize, quantized_matmul, Backend, Dtype, MlxArray};

#[path = "../common/check.rs"]
mod check;
#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/exit.rs"]
mod exit;
#[path = "../common/graphs.rs"]
mod graphs;

mod probes;
mod sweep;

use probes::{folds, paths, probe};
use sweep::{sweep, sweep_axis_one};

use check::to_f64;

/// The Qwen3-14B down projection: 17408 inputs, 5120 outputs.
const QWEN_DOWN: (usize, usize) = (17408, 5120);
/// The relErr gate of every trellis result.
const GATE: f64 = 1e-2;

/// The tables' rows, and the results that missed the gate.
#[derive(Default)]
struct Report {
    table: String,
    failures: Vec<String>,
}

impl Report {
    /// Records `what` as a failure unless `y` is finite and its relErr `err` is below [`GATE`].
    fn check(&mut self, y: &MlxArray, err: f64, what: impl FnOnce() -> String) -> Result<()> {
        let (ok, status) = check::verdict(y, err, GATE)?;
        if !ok {
            self.failures.push(format!("{}: relErr {err:.2e}, {status}", what()));
        }
        Ok(())
    }
}

/// Benchmark of the Qwen down projection (17408 -> 5120) on MLX's CUDA back-end: the trellis
/// kernels against MLX's dense bf16 matmul of the same decoded layer and MLX's affine
/// quantized_matmul of it at 4 and 3 bits (group 64).
///
/// Every figure is per call: --calls calls are queued and evaluated together; the median and best
/// of --evals evaluations are reported. Each trellis result is checked against the f64 reference
/// (relErr = max|a-b| / max|b|). Exit status: 0 every check passed, 1 a relErr of 1e-2 or more or
/// a non-finite output, 2 an error (including a back-end other than CUDA).
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo build --release --features tuning --example bench_down
  target/release/examples/bench_down --rows 1,8,64 --json out.json
  target/release/examples/bench_down --sweep --rows 16      # time kernel configurations instead
  target/release/examples/bench_down --sweep --configs \"nc8 mt1 ks1 w4 s52 fold pack; nc2 mt3 ks4 w8 s13\"
  target/release/examples/bench_down --paths                # the fused kernel against the dense path
  target/release/examples/bench_down --shape 576,1536 --sweep --rows 1  # a small layer (SmolLM2's gate and up)
  target/release/examples/bench_down --shape 1536,576 --sweep --axis-one --rows 1  # SmolLM2's down (axis 1)
  target/release/examples/bench_down --shape 5120,17408 --sweep --axis-one --fused --rows 1,8  # Qwen3-14B's gate·up, both axis-1 kernels
  target/release/examples/bench_down --shape 5120,10560 --sweep --axis-one --fused --planned --rows 1  # the plan alone, 660 row tiles
  target/release/examples/bench_down --probe --rows 1       # where one queued call's time goes
  target/release/examples/bench_down --folds --splits 13,32 # MLX's fold of partials in candidate layouts")]
struct Args {
    #[command(flatten)]
    rows: cli::BenchRows,
    /// Calls queued per evaluation
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value_t = 20)]
    calls: usize,
    /// Timed evaluations (after one warm-up)
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value_t = 30)]
    evals: usize,
    /// Write the table as JSON to this file
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Time the down kernel's configurations worth trying at each row count instead
    #[arg(long)]
    sweep: bool,
    /// With --sweep: time the plan and these configurations (separated by `;`, each fields on the
    /// default: ncN mtN ksN wN (warps) sN (splits) stN (stages), options fold, pack, prescaled,
    /// mbar, unroll (both rings' rounds), unroll2 (the B tiles' slots), direct)
    #[arg(long, value_name = "LIST", value_parser = parse_down_configs, requires = "sweep")]
    configs: Option<::std::vec::Vec<CudaDownConfig>>,
    /// Where one queued call's time goes (the kernels alone, the fold, launch costs), and two
    /// calls of the layer against one call of the pair variant (an MLP's gate and up), and the
    /// pair and the single call fed from fold counters (as a decoding model runs them)
    #[arg(long)]
    probe: bool,
    /// The fused kernel against the dense path (decode, then MLX's matmul)
    #[arg(long)]
    paths: bool,
    /// MLX's fold of split-K partials in candidate layouts (no trellis kernel)
    #[arg(long)]
    folds: bool,
    /// Split counts for --folds
    #[arg(long = "splits", value_name = "S,...", value_delimiter = ',', value_parser = cli::positive,
          default_value = "13,19,26,32,40,48,64")]
    fold_splits: Vec<usize>,
    /// Synthetic layers: 3 (interleaved), 2 or 4 (row-major); repeat for several
    #[arg(long = "bits", value_name = "K", value_parser = bits_layout, default_values = ["3", "2"])]
    layouts: Vec<(u32, CodeLayout)>,
    /// Activation dtype: bf16, f16 or f32
    #[arg(long, value_name = "DTYPE", value_parser = cli::float_dtype, default_value = "bf16")]
    dtype: Dtype,
    /// The synthetic layer's inputs and outputs, `IN,OUT` (an axis-0 layer: the inputs a multiple
    /// of 16, the outputs of 256), for example 576,1536 for SmolLM2-135M's gate and up
    /// [default: 17408,5120, the Qwen3-14B down projection]
    #[arg(long, value_name = "IN,OUT", value_parser = shape)]
    shape: Option<(usize, usize)>,
    /// With --sweep: an axis-1 layer (stored `[out, in]`, row-major codes, as gate and up of the
    /// Qwen layout and SmolLM2's down) of --shape, and the axis-1 kernel's shapes (`gate_up.cu`)
    #[arg(long = "axis-one", requires = "sweep")]
    axis_one: bool,
    /// With --axis-one: the fused gate·up·SwiGLU (--shape's layer as gate and a second seeded
    /// layer of the same shape as up), both axis-1 kernels' shapes, checked against the f64
    /// SwiGLU
    #[arg(long, requires = "axis_one")]
    fused: bool,
    /// With --axis-one: time the plan alone (no shapes around it): its duration against the
    /// layer's outputs (--shape), for instance how a partial last wave of thread blocks costs
    #[arg(long, requires = "axis_one")]
    planned: bool,
}

impl Args {
    /// The layer's (inputs, outputs).
    fn shape(&self) -> (usize, usize) {
        self.shape.unwrap_or(QWEN_DOWN)
    }
}

/// `--shape IN,OUT`.
fn shape(s: &str) -> Result<(usize, usize), String> {
    let parts: Vec<usize> = s.split(',').map(|p| cli::positive(p.trim())).collect::<Result<_, _>>()?;
    match parts[..] {
        [inp, out] => Ok((inp, out)),
        _ => Err(format!("{s:?}: expected IN,OUT (two positive counts)")),
    }
}

/// `--bits K`: the synthetic layer of width K and its layout.
fn bits_layout(s: &str) -> Result<(u32, CodeLayout), String> {
    let k = cli::bits(s)?;
    Ok((k, if k == 3 { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor }))
}

fn parse() -> Result<Args> {
    Ok(Args::parse())
}

/// Median and best per-call microseconds of `f`, `calls` calls queued per evaluation.
fn time(calls: usize, evals: usize, f: &dyn Fn() -> mlx_trellis::Result<MlxArray>) -> Result<(f64, f64)> {
    time_each(calls, evals, &|| Ok(vec![f()?]))
}

/// [`time`] of a call that gives several arrays, all evaluated.
fn time_each(calls: usize, evals: usize, f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>) -> Result<(f64, f64)> {
    let run = || -> Result<f64> {
        let outs = (0..calls).map(|_| f()).collect::<mlx_trellis::Result<Vec<_>>>()?.concat();
        let refs: Vec<&MlxArray> = outs.iter().collect();
        let t = Instant::now();
        eval_all(&refs)?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
    };
    run()?; // warm-up: compilation, caches, allocator
    let mut v = (0..evals).map(|_| run()).collect::<Result<Vec<_>>>()?;
    v.sort_by(f64::total_cmp);
    Ok((v[v.len() / 2], v[0]))
}

struct Layer {
    name: String,
    host: HostLayer,
    lin: TrellisLinear,
    /// Dense `[out, in]` bf16 weights of the same decoded layer (MLX's `x @ w.T` baseline).
    dense: MlxArray,
    q4: (MlxArray, MlxArray, MlxArray),
    q3: (MlxArray, MlxArray, MlxArray),
}

fn build(k: u32, layout: CodeLayout, (inp, out): (usize, usize), axis_one: bool) -> Result<Layer> {
    let t = Instant::now();
    let host = if axis_one {
        // The axis-1 kernel reads row-major codes only.
        synthetic_layer(out, inp, k, 12, 1, CodeLayout::RowMajor, 0.015, 7 + k as u64)?
    } else {
        synthetic_layer(inp, out, k, 12, 0, layout, 0.015, 7 + k as u64)?
    };
    let lin = TrellisLinear::from_host("down", &host)?;
    let w = expand(&host.codes, &host.scales, &host.geometry)?; // [in, out] f32
                                                                // The stored matrix is `[in, out]` for axis 0 and `[out, in]` for axis 1.
    let stored =
        if axis_one { MlxArray::from_slice(&w, &[out, inp])? } else { MlxArray::from_slice(&w, &[inp, out])?.t()? };
    let dense = stored.astype(Dtype::Bfloat16)?.contiguous()?;
    dense.eval()?;
    let q4 = quantize(&dense, 64, 4)?;
    let q3 = quantize(&dense, 64, 3)?;
    eval_all(&[&q4.0, &q4.1, &q4.2, &q3.0, &q3.1, &q3.2])?;
    let name = match layout {
        _ if axis_one => format!("k{k} axis 1"),
        CodeLayout::K3Interleaved => format!("k{k} interleaved"),
        CodeLayout::RowMajor => format!("k{k} row-major"),
    };
    eprintln!("[bench] built {name} and its dense/affine twins in {:.1} s", t.elapsed().as_secs_f64());
    Ok(Layer { name, host, lin, dense, q4, q3 })
}

/// One row count of a layer: its activations, their rows, and the f64 reference output.
#[derive(Clone, Copy)]
pub(crate) struct Case<'a> {
    layer: &'a Layer,
    x: &'a MlxArray,
    m: usize,
    want: &'a [f64],
}

fn main() -> ExitCode {
    graphs::start();
    exit::finish(bench(), "[bench] a trellis result missed its check (see above)")
}

fn bench() -> Result<bool> {
    let args = parse()?;
    if backend() != Backend::Cuda {
        bail!("bench_down times the CUDA kernels; this MLX build's back-end is {}", backend());
    }
    let max_m = *args.rows.rows.iter().max().context("no rows")?;
    if args.folds {
        return folds(&args).map(|()| true);
    }
    let mut report = Report::default();
    let mut json = String::from("[\n");
    let (inp, out) = args.shape();
    for &(k, layout) in &args.layouts {
        let layer = build(k, layout, (inp, out), args.axis_one)?;
        let g = *layer.lin.geometry();
        // --fused: the up projection, another seeded layer of the same geometry.
        let up = if args.fused {
            let host = synthetic_layer(out, inp, k, 12, 1, CodeLayout::RowMajor, 0.015, 17 + k as u64)?;
            Some((TrellisLinear::from_host("up", &host)?, host))
        } else {
            None
        };
        let n = max_m.checked_mul(inp).context("--rows: the activations' size overflows")?;
        let x_all = MlxArray::from_slice(&gaussian(n, 99)?, &[max_m, inp])?.astype(args.dtype)?;
        x_all.eval()?;
        let t = Instant::now();
        let want = match &up {
            Some((_, up_host)) => swiglu_f64(&to_f64(&x_all)?, max_m, &layer.host, up_host)?,
            None => forward_f64(&to_f64(&x_all)?, max_m, &layer.host.codes, &layer.host.scales, &g)?,
        };
        eprintln!("[bench] f64 reference ({max_m} rows) in {:.1} s", t.elapsed().as_secs_f64());
        for &m in &args.rows.rows {
            let x = x_all.slice(&[0, 0], &[m as i32, inp as i32], &[1, 1])?.contiguous()?;
            x.eval()?;
            let want = &want[..m * out];
            let case = Case { layer: &layer, x: &x, m, want };
            if args.sweep && args.axis_one {
                sweep_axis_one(case, up.as_ref().map(|u| &u.0), &args, &mut report)?;
                continue;
            }
            if args.sweep {
                sweep(case, &args, &mut report)?;
                continue;
            }
            if args.probe {
                probe(case, &args, &mut report)?;
                continue;
            }
            if args.paths {
                paths(case, &args, &mut report)?;
                continue;
            }
            let y = layer.lin.forward_with(&x, ForwardPath::Cuda)?;
            let err = rel_err(&to_f64(&y)?, want)?;
            report.check(&y, err, || format!("{} M={m}", layer.name))?;
            let ours = time(args.calls, args.evals, &|| layer.lin.forward_with(&x, ForwardPath::Cuda))?;
            let wt = layer.dense.t()?;
            let bf16 = time(args.calls, args.evals, &|| x.matmul(&wt))?;
            let q4 = time(args.calls, args.evals, &|| {
                quantized_matmul(&x, &layer.q4.0, &layer.q4.1, &layer.q4.2, true, 64, 4)
            })?;
            let q3 = time(args.calls, args.evals, &|| {
                quantized_matmul(&x, &layer.q3.0, &layer.q3.1, &layer.q3.2, true, 64, 3)
            })?;
            let rate = inp as f64 * out as f64 / (ours.0 * 1e-6) / 1e12;
            let path =
                if uses_dense(m, x.dtype()) { "dense + MLX matmul".to_string() } else { plan(&g, m).to_string() };
            let _ = writeln!(
                report.table,
                "| {} | {m} | {:.1} ({:.1}) | {:.1} | {:.2}x | {:.1} | {:.1} | {:.2}x | {rate:.2} | {err:.1e} | {path} |",
                layer.name, ours.0, ours.1, bf16.0, bf16.0 / ours.0, q4.0, q3.0, q3.0 / ours.0
            );
            let _ = writeln!(
                json,
                "  {{\"layout\": \"{}\", \"m\": {m}, \"trellis_us\": {:.2}, \"trellis_best_us\": {:.2}, \"bf16_us\": {:.2}, \"bf16_best_us\": {:.2}, \"affine4_us\": {:.2}, \"affine3_us\": {:.2}, \"tweights_per_s\": {rate:.3}, \"rel_err\": {err:.3e}}},",
                layer.name, ours.0, ours.1, bf16.0, bf16.1, q4.0, q3.0
            );
            eprintln!(
                "[bench] {} M={m}: trellis {:.1} us, bf16 {:.1} us, relErr {err:.1e}",
                layer.name, ours.0, bf16.0
            );
        }
    }
    println!("{}\n", graphs::note());
    if args.paths {
        println!("| layout | M | fused µs | dense path µs | expand alone µs | fused relErr | dense relErr |\n|---|---|---|---|---|---|---|");
    } else if args.sweep && args.axis_one {
        println!("| layout | M | mt | rt | warps | bias fold | IMAD pack | kernel | call median us | call best us | relErr |\n|---|---|---|---|---|---|---|---|---|---|---|");
    } else if args.sweep {
        println!("| layout | M | nc | mt | ks | warps | splits | stages | bias fold | IMAD pack | prescaled | mbarriers | steps unrolled over (or direct codes) | call median us | call best us | kernel alone median us | relErr |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    } else {
        println!(
            "Axis-0 projection {inp} -> {out}, bf16 activations, per call ({} calls per evaluation, median (best) of {})",
            args.calls, args.evals
        );
        println!("| layout | M | trellis µs | MLX bf16 µs | vs bf16 | affine 4-bit µs | affine 3-bit µs | vs affine 3 | Tweights/s | relErr | path |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
    }
    print!("{}", report.table);
    if let Some(path) = &args.json {
        let body = json.trim_end().trim_end_matches(',').to_string() + "\n]\n";
        std::fs::write(path, body)?;
    }
    for f in &report.failures {
        eprintln!("[bench] FAIL {f} (gate {GATE:.0e}, against the f64 reference)");
    }
    Ok(report.failures.is_empty())
}

/// One configuration's call `f` at `m` rows, checked against the reference `want` into `report`:
/// its relErr, or `None` where it failed to run (a launch the GPU refuses), reported and skipped.
fn checked_run(
    layer: &Layer,
    m: usize,
    cfg: &dyn std::fmt::Debug,
    want: &[f64],
    report: &mut Report,
    f: &dyn Fn() -> mlx_trellis::Result<MlxArray>,
) -> Result<Option<f64>> {
    let y = match f().and_then(|y| {
        y.eval()?;
        Ok(y)
    }) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("[sweep] {} M={m} {cfg:?}: failed: {e:#}", layer.name);
            return Ok(None);
        }
    };
    let err = rel_err(&to_f64(&y)?, want)?;
    report.check(&y, err, || format!("{} M={m} {cfg:?}", layer.name))?;
    Ok(Some(err))
}
