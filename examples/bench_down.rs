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
use mlx_trellis::trellis::cuda::down::{down_pair_cuda, uses_dense};
use mlx_trellis::trellis::cuda::expand::{down_cuda_dense, expand_cuda};
use mlx_trellis::trellis::cuda::gate_up;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, axis_one_with, down_cuda_partials, down_cuda_with, plan, plan_for, split_pass_tiles, swiglu_with,
    AxisOneConfig, AxisOneKernel, CudaDownConfig, StepUnroll, INT8_MAX_ROWS,
};
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_layer, CodeLayout, ForwardPath, HostLayer, TrellisGeometry, TrellisLinear};
use mlx_trellis::{backend, eval_all, quantize, quantized_matmul, Backend, Dtype, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;
#[path = "common/graphs.rs"]
mod graphs;

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
    /// default: ncN mtN ksN wN (warps) sN (splits) stN (stages), flags fold, pack, prescaled, mbar)
    #[arg(long, value_name = "LIST", value_parser = parse_configs, requires = "sweep")]
    configs: Option<::std::vec::Vec<CudaDownConfig>>,
    /// Where one queued call's time goes (the kernels alone, the fold, launch costs), and two
    /// calls of the layer against one call of the pair variant (an MLP's gate and up)
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
            if args.sweep && args.axis_one {
                sweep_axis_one(&layer, up.as_ref().map(|u| &u.0), &x, m, want, &args, &mut report)?;
                continue;
            }
            if args.sweep {
                sweep(&layer, &x, m, want, &args, &mut report)?;
                continue;
            }
            if args.probe {
                probe(&layer, &x, m, &args)?;
                continue;
            }
            if args.paths {
                paths(&layer, &x, m, want, &args, &mut report)?;
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
            let path = if uses_dense(m, x.dtype()) {
                "dense + MLX matmul".to_string()
            } else {
                let cfg = plan(&g, m);
                format!(
                    "nc{} mt{} ks{} w{} s{}{}",
                    cfg.nc,
                    cfg.mt,
                    cfg.ks,
                    cfg.warps,
                    cfg.splits,
                    if cfg.prescaled && cfg.mbarriers {
                        " prescaled mbar"
                    } else if cfg.prescaled {
                        " prescaled"
                    } else {
                        ""
                    }
                )
            };
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

/// Every configuration worth trying at `m` rows, timed and checked against the reference `want`.
fn sweep(layer: &Layer, x: &MlxArray, m: usize, want: &[f64], args: &Args, report: &mut Report) -> Result<()> {
    let g = *layer.lin.geometry();
    let configs = if let Some(given) = &args.configs {
        std::iter::once(plan_for(&g, m, x.dtype())).chain(given.iter().copied()).collect()
    } else {
        fragment_configs(&g, x.dtype(), m)
    };
    time_configs(layer, x, m, want, args, report, configs)
}

/// The axis-1 kernel's plan and its shapes around it at `m` rows (every row tile count and warp
/// count of the plan's pass, and the int8 kernel's), timed and checked against the reference
/// `want`: one projection, or with `up` the fused gate·up·SwiGLU (`layer` as gate).
fn sweep_axis_one(
    layer: &Layer,
    up: Option<&TrellisLinear>,
    x: &MlxArray,
    m: usize,
    want: &[f64],
    args: &Args,
    report: &mut Report,
) -> Result<()> {
    let g = *layer.lin.geometry();
    let fused = up.is_some();
    let planned = axis_one_plan(m, x.dtype(), fused, g.out_features());
    // The plan's shapes, and each other kernel's where it serves these rows.
    let mut bases = vec![planned];
    let mt = planned.mt;
    let others = [
        AxisOneConfig::plain(AxisOneKernel::Int8),
        AxisOneConfig { mt, ..AxisOneConfig::plain(AxisOneKernel::Gemm) },
        AxisOneConfig { mt, bias_fold: true, ..AxisOneConfig::plain(AxisOneKernel::Wgmma) },
        AxisOneConfig { mt, bias_fold: mt <= 2, ..AxisOneConfig::plain(AxisOneKernel::Fragment) },
        AxisOneConfig::specialized(m, fused),
    ];
    for other in others {
        let serves = other.kernel != AxisOneKernel::Int8 || m <= INT8_MAX_ROWS;
        if other.kernel != planned.kernel && serves && other.check(x.dtype(), fused).is_ok() {
            bases.push(other);
        }
    }
    // The GEMM's shapes around its base: every warp count (its row tiles are one warp's), with and
    // without its code-word prefetch, two or four warps a tile over the inputs (split_k) or over
    // the pass's rows (row_split, each warp's tiles as the plan shares them out); the
    // warpgroup GEMM's one and two warpgroups a block; the warp-specialized GEMM's stages. The
    // fragment kernel's warp counts (its warps split a row's blocks: fewer warps, more thread
    // blocks an SM, and the last wave moves). The int8 kernel's base shape as it is.
    if args.planned {
        bases.clear();
    }
    let mut configs = vec![planned];
    for base in bases {
        let around: Vec<AxisOneConfig> = match base.kernel {
            AxisOneKernel::Gemm => {
                let split = [(2, 2, 1), (4, 2, 1), (6, 2, 1), (8, 2, 1), (4, 4, 1), (8, 4, 1)];
                let rows = [(2, 1, 2), (4, 1, 2), (6, 1, 2), (8, 1, 2), (4, 1, 4), (8, 1, 4), (12, 1, 4), (16, 1, 4)];
                [1, 2, 3, 4, 8]
                    .map(|warps| (warps, 1, 1))
                    .into_iter()
                    .chain(split)
                    .chain(rows)
                    .flat_map(|(warps, split_k, row_split)| {
                        let mt = split_pass_tiles(m, row_split);
                        [true, false].map(|prefetch| AxisOneConfig { mt, warps, prefetch, split_k, row_split, ..base })
                    })
                    .collect()
            }
            AxisOneKernel::Fragment => [base.warps, 1, 2, 5, 8].map(|warps| AxisOneConfig { warps, ..base }).to_vec(),
            AxisOneKernel::Wgmma => [4, 8].map(|warps| AxisOneConfig { warps, ..base }).to_vec(),
            AxisOneKernel::Specialized => [4, 5, 6].map(|stages| AxisOneConfig { stages, ..base }).to_vec(),
            AxisOneKernel::Int8 => vec![base],
        };
        for cfg in around {
            if !configs.contains(&cfg) && cfg.check(x.dtype(), fused).is_ok() {
                configs.push(cfg);
            }
        }
    }
    for cfg in configs {
        let f = || match up {
            Some(up) => swiglu_with(x, &layer.lin, up, cfg),
            None => axis_one_with(x, layer.lin.codes(), layer.lin.scales(), &g, cfg),
        };
        let Some(err) = checked_run(layer, m, &cfg, want, report, &f)? else {
            continue;
        };
        let (med, best) = time(args.calls, args.evals.min(15), &f)?;
        let _ = writeln!(
            report.table,
            "| {} | {m} | {} | {} | {} | {} | {} | {} | {med:.1} | {best:.1} | {err:.1e} |",
            if fused { format!("{} fused", layer.name) } else { layer.name.clone() },
            cfg.mt,
            cfg.rt,
            cfg.warps,
            cfg.bias_fold,
            cfg.pack_fma,
            format!(
                "{:?}{}{}{}",
                cfg.kernel,
                if cfg.prefetch { " prefetch" } else { "" },
                if cfg.split_k > 1 { format!(" split_k {}", cfg.split_k) } else { String::new() },
                if cfg.row_split > 1 { format!(" row_split {}", cfg.row_split) } else { String::new() }
            )
            .to_lowercase()
        );
        eprintln!("[sweep] {} M={m} {cfg:?}: {med:.1} us", layer.name);
    }
    // Where 16-bit rows take the dense path (decode to bf16, MLX's matmul), that path as planned.
    if gate_up::uses_dense(m, x.dtype()) {
        let f = || match up {
            Some(up) => gate_up::swiglu(x, &layer.lin, up),
            None => gate_up::linear(x, layer.lin.codes(), layer.lin.scales(), &g),
        };
        if let Some(err) = checked_run(layer, m, &"dense path", want, report, &f)? {
            let (med, best) = time(args.calls, args.evals.min(15), &f)?;
            let name = if fused { format!("{} fused", layer.name) } else { layer.name.clone() };
            let _ = writeln!(
                report.table,
                "| {name} | {m} | - | - | - | - | - | dense path | {med:.1} | {best:.1} | {err:.1e} |"
            );
            eprintln!("[sweep] {} M={m} dense path: {med:.1} us", layer.name);
        }
    }
    Ok(())
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

/// Configurations separated by `;`, each a list of fields on [`CudaDownConfig::default`]: `ncN`,
/// `mtN`, `ksN`, `wN` (warps), `sN` (splits), `stN` (stages), and the flags `fold` (bias fold), `pack` (IMAD pack), `prescaled` (B tiles from the
/// pre-pass kernel), `mbar` (its ring on mbarriers), `unroll` (the steps in unrolled rounds of
/// both rings), `unroll2` (in unrolled rounds of the B tiles' two slots) and `direct` (code
/// words straight to registers, the split's B tiles built once).
fn parse_configs(text: &str) -> Result<Vec<CudaDownConfig>> {
    let mut configs = Vec::new();
    for spec in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let mut c = CudaDownConfig::default();
        for token in spec.split_whitespace() {
            let number = |prefix: &str| -> Result<u32> {
                token[prefix.len()..].parse().with_context(|| format!("--configs: {token:?} in {spec:?}"))
            };
            match token {
                "fold" => c.bias_fold = true,
                "pack" => c.pack_fma = true,
                "prescaled" => c.prescaled = true,
                "mbar" => c.mbarriers = true,
                "unroll" => c.step_unroll = StepUnroll::BothRings,
                "unroll2" => c.step_unroll = StepUnroll::BTileSlots,
                "direct" => c.direct_codes = true,
                _ if token.starts_with("nc") => c.nc = number("nc")?,
                _ if token.starts_with("mt") => c.mt = number("mt")?,
                _ if token.starts_with("ks") => c.ks = number("ks")?,
                _ if token.starts_with("st") => c.stages = number("st")?,
                _ if token.starts_with('w') => c.warps = number("w")?,
                _ if token.starts_with('s') => c.splits = number("s")?,
                _ => bail!("--configs: unknown field {token:?} in {spec:?}"),
            }
        }
        configs.push(c);
    }
    if configs.is_empty() {
        bail!("--configs: no configuration in {text:?}");
    }
    Ok(configs)
}

/// The kernel's configurations worth trying at `m` rows.
fn fragment_configs(g: &TrellisGeometry, dtype: Dtype, m: usize) -> Vec<CudaDownConfig> {
    let mut configs = Vec::new();
    // (sub-tiles per warp, 8-row tiles per pass, warps per block) worth trying at this M: the
    // neighbourhood of the measured plan (wider sweeps of the other fields found nothing better
    // there). Blocks of fewer than 16 warps' worth of sub-tiles cover a part of a coded block.
    // One pass of just the call's rows (the plan from 9 rows).
    let exact = m.div_ceil(8).clamp(1, 8) as u32;
    let shapes: Vec<(u32, u32, &[u32])> = match m {
        // NC 4: more, smaller warps' worth of registers.
        0..=8 => vec![(4, 1, &[2, 4, 8]), (8, 1, &[1, 2, 4])],
        9..=16 => vec![(2, exact, &[8]), (4, 2, &[2, 4, 8]), (8, 2, &[1, 2, 4])],
        // NC 2 in one pass of 8 warps (the plan), or NC 4 tiles.
        17..=32 => vec![(2, exact, &[4, 8]), (4, 4, &[2, 4, 8])],
        // NC 2 in one pass (the plan), MT 4: two passes of 32 rows.
        33..=64 => vec![(2, exact, &[4, 8]), (2, 4, &[8])],
        _ => vec![(2, 8, &[4, 8])],
    };
    // MLX's fold of the partials grows with the splits (17 µs alone at 64 rows and 32 splits),
    // and so do the partials the kernel writes, so fewer splits are worth a slightly longer
    // kernel; some counts make whole waves of blocks: 13 at 9-64 rows (the 16-warp blocks, one
    // per SM, and the two-pass shape's), 19 at 9-16 (NC 4, MT 2: three blocks per SM).
    let splits_list: &[u32] = match m {
        0..=1 => &[32, 64],
        2..=8 => &[20, 26, 32],
        9..=16 => &[13, 19, 26, 32],
        17..=64 => &[13, 16, 26],
        _ => &[16],
    };
    // (bias fold, IMAD pack): up to 16 rows with the bias fold, at one row also with half of
    // its pairs packed by an IMAD (it lost at 8 and 16 rows); at 17-32 rows with and without the
    // fold; from 33 rows without it (the plan: the fold's accumulators would not fit 128
    // registers).
    let variants: &[(bool, bool)] = match m {
        0..=1 => &[(true, false), (true, true)],
        2..=16 => &[(true, false)],
        17..=32 => &[(false, false), (true, false), (true, true)],
        _ => &[(false, false)],
    };
    // Steps of 16 rows lost at every M above 8, steps of 64 at every M up to 8.
    let ks_list: &[u32] = match m {
        0..=8 => &[1, 2],
        _ => &[2, 4],
    };
    for &(nc, mt, warps_list) in &shapes {
        for &warps in warps_list {
            for &splits in splits_list {
                for &(bias_fold, pack_fma) in variants {
                    for &ks in ks_list {
                        let cfg =
                            CudaDownConfig { nc, mt, ks, warps, splits, bias_fold, pack_fma, ..Default::default() };
                        if let Some(cfg) = cfg.with_deepest_ring(g, dtype) {
                            configs.push(cfg);
                            // Its block-barrier ring's steps in unrolled rounds.
                            for step_unroll in [StepUnroll::BTileSlots, StepUnroll::BothRings] {
                                configs.push(CudaDownConfig { step_unroll, ..cfg });
                            }
                            // No ring: the code words straight to registers (few rows: the
                            // split's B tiles are built once).
                            let direct = CudaDownConfig { direct_codes: true, ..cfg };
                            if m <= 16 && direct.fits(g, dtype) {
                                configs.push(direct);
                            }
                        }
                        // B tiles from the pre-pass kernel, with a block barrier per step and
                        // on an mbarrier ring (the plan from 9 rows).
                        let prescaled = CudaDownConfig { prescaled: true, ..cfg };
                        if m >= 2 {
                            if let Some(cfg) = prescaled.with_deepest_ring(g, dtype) {
                                configs.push(cfg);
                                if cfg.stages >= 3 {
                                    configs.push(CudaDownConfig { mbarriers: true, ..cfg });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    configs
}

/// Times each configuration at `m` rows (whole call and kernel alone) into `report`; one that
/// fails to run is reported and skipped, one whose result misses the gate is a failure.
fn time_configs(
    layer: &Layer,
    x: &MlxArray,
    m: usize,
    want: &[f64],
    args: &Args,
    report: &mut Report,
    configs: Vec<CudaDownConfig>,
) -> Result<()> {
    let g = *layer.lin.geometry();
    for cfg in configs {
        let f = || down_cuda_with(x, layer.lin.codes(), layer.lin.scales(), &g, cfg);
        let Some(err) = checked_run(layer, m, &cfg, want, report, &f)? else {
            continue;
        };
        let (med, best) = time(args.calls, args.evals.min(15), &f)?;
        let kernel = time(args.calls, args.evals.min(15), &|| {
            down_cuda_partials(x, layer.lin.codes(), layer.lin.scales(), &g, cfg)
        })?;
        let _ = writeln!(
            report.table,
            "| {} | {m} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {med:.1} | {best:.1} | {:.1} | {err:.1e} |",
            layer.name,
            cfg.nc,
            cfg.mt,
            cfg.ks,
            cfg.warps,
            cfg.splits,
            cfg.stages,
            cfg.bias_fold,
            cfg.pack_fma,
            cfg.prescaled,
            cfg.mbarriers,
            match (cfg.direct_codes, cfg.step_unroll) {
                (true, _) => "direct codes",
                (false, StepUnroll::Rolled) => "-",
                (false, StepUnroll::BTileSlots) => "B tiles",
                (false, StepUnroll::BothRings) => "both",
            },
            kernel.0
        );
        eprintln!("[sweep] {} M={m} {cfg:?}: {med:.1} us", layer.name);
    }
    Ok(())
}

/// The fused kernel (its plan) against the dense path (decode, then MLX's matmul) at `m` rows,
/// and the decode alone: where the planned dispatch should switch.
fn paths(layer: &Layer, x: &MlxArray, m: usize, want: &[f64], args: &Args, report: &mut Report) -> Result<()> {
    let g = *layer.lin.geometry();
    let (codes, scales) = (layer.lin.codes(), layer.lin.scales());
    let cfg = plan(&g, m);
    let fused = || down_cuda_with(x, codes, scales, &g, cfg);
    let dense = || down_cuda_dense(x, codes, scales, &g);
    let (y_fused, y_dense) = (fused()?, dense()?);
    let fused_err = rel_err(&to_f64(&y_fused)?, want)?;
    let dense_err = rel_err(&to_f64(&y_dense)?, want)?;
    report.check(&y_fused, fused_err, || format!("{} M={m} fused", layer.name))?;
    report.check(&y_dense, dense_err, || format!("{} M={m} dense path", layer.name))?;
    let (f, d) = (time(args.calls, args.evals, &fused)?, time(args.calls, args.evals, &dense)?);
    let e = time(args.calls, args.evals, &|| expand_cuda(codes, scales, &g, x.dtype()))?;
    let _ = writeln!(
        report.table,
        "| {} | {m} | {:.1} | {:.1} | {:.1} | {fused_err:.1e} | {dense_err:.1e} |",
        layer.name, f.0, d.0, e.0
    );
    eprintln!("[paths] {} M={m}: fused {:.1} us, dense {:.1} us, expand {:.1} us", layer.name, f.0, d.0, e.0);
    Ok(())
}

/// Where the time of one call goes: the kernel alone, MLX's fold, a trivial custom kernel.
fn probe(layer: &Layer, x: &MlxArray, m: usize, args: &Args) -> Result<()> {
    use mlx_trellis::{CudaKernel, KernelSource, LaunchConfig};
    let g = *layer.lin.geometry();
    let (inp, out) = args.shape();
    let cfg = plan(&g, m);
    let full = time(args.calls, args.evals, &|| layer.lin.forward_with(x, ForwardPath::Cuda))?;
    let kernel =
        time(args.calls, args.evals, &|| down_cuda_partials(x, layer.lin.codes(), layer.lin.scales(), &g, cfg))?;
    let partial = down_cuda_partials(x, layer.lin.codes(), layer.lin.scales(), &g, cfg)?;
    partial.eval()?;
    let fold = time(args.calls, args.evals, &|| partial.sum_axes(&[1], false)?.astype(Dtype::Bfloat16))?;
    let noop = CudaKernel::new(
        KernelSource::new("bench_noop", &["inp"], &["out"], "if (threadIdx.x == 0) out[0] = inp[0];"),
        0,
    )?;
    let tiny = time(args.calls, args.evals, &|| {
        Ok(noop.apply(&[x], &LaunchConfig::new([32, 1, 1], [32, 1, 1]).output(&[1], Dtype::Bfloat16))?.remove(0))
    })?;
    // The same kernel on 1/17 of the input rows: if its time per call hardly drops, calls are
    // bound by launch and host costs, not by the GPU.
    let small_rows = (inp / 17 / 16).max(1) * 16;
    let small = synthetic_layer(small_rows, out, g.k, g.l, 0, g.layout(), 0.015, 3)?;
    let small_lin = TrellisLinear::from_host("small", &small)?;
    let xs = x.slice(&[0, 0], &[m as i32, small_rows as i32], &[1, 1])?.contiguous()?;
    let small_cfg = CudaDownConfig { splits: cfg.splits.min((small_rows as u32 / (16 * cfg.ks)).max(1)), ..cfg };
    let small_kernel = time(args.calls, args.evals, &|| {
        down_cuda_partials(&xs, small_lin.codes(), small_lin.scales(), small_lin.geometry(), small_cfg)
    })?;
    // No-op kernels shaped like the planned one (its inputs and partials, 20 x SPLITS blocks of
    // 128 threads as the 1- and 32-row plans launch): what one queued launch of that shape costs
    // with a short source, with and without dynamic shared memory.
    let shaped_noop = |shared: usize| -> Result<(f64, f64)> {
        let noop = CudaKernel::new(
            KernelSource::new(
                &format!("bench_noop_shaped_{shared}"),
                &["x", "codes", "scales"],
                &["partial"],
                "if (threadIdx.x == 0 && blockIdx.x + blockIdx.y + blockIdx.z == 0) partial[0] = float(codes[0]);",
            ),
            shared,
        )?;
        let launch = LaunchConfig::new([128, 20, cfg.splits as usize], [128, 1, 1])
            .output(&[m, cfg.splits as usize, out], Dtype::Float32);
        time(args.calls, args.evals, &|| {
            Ok(noop.apply(&[x, layer.lin.codes(), layer.lin.scales()], &launch)?.remove(0))
        })
    };
    let (shaped, shaped_40k, shaped_100k) = (shaped_noop(0)?, shaped_noop(40960)?, shaped_noop(102400)?);
    println!(
        "probe {} M={m}: no-op kernels shaped like the plan (3 inputs, [{m}, {}, {out}] f32 partials, 20 x {} blocks): {:.1} us, with 40 KB dynamic shared memory {:.1}, with 100 KB {:.1}",
        layer.name, cfg.splits, cfg.splits, shaped.0, shaped_40k.0, shaped_100k.0
    );
    let build = {
        let t = Instant::now();
        for _ in 0..100 {
            let _ = layer.lin.forward_with(x, ForwardPath::Cuda)?;
        }
        t.elapsed().as_secs_f64() * 1e4
    };
    println!(
        "probe {} M={m} {cfg:?}: full {:.1} us, kernel only {:.1}, kernel on {small_rows} rows {:.1}, fold {:.1}, no-op kernel {:.1}, graph build (host) {build:.1} us/call",
        layer.name, full.0, kernel.0, small_kernel.0, fold.0, tiny.0
    );
    // The host's graph building per call of each kind (no evaluation), and the evaluation of
    // queued calls of no-op kernels whose source is short or long (MLX builds a custom
    // kernel's whole source at every call and hashes it at every evaluation).
    let per_call = |f: &dyn Fn() -> mlx_trellis::Result<MlxArray>| -> Result<f64> {
        let _ = f()?;
        let t = Instant::now();
        for _ in 0..200 {
            let _ = f()?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / 200.0)
    };
    let long_header: String =
        (0..600).map(|i| format!("__device__ inline int bench_pad_{i}(int v) {{ return v * {i} + 7; }}\n")).collect();
    let long_noop = CudaKernel::new(
        KernelSource::new("bench_noop_long", &["inp"], &["out"], "if (threadIdx.x == 0) out[0] = inp[0];")
            .with_header(&long_header),
        0,
    )?;
    let one = LaunchConfig::new([32, 1, 1], [32, 1, 1]).output(&[1], Dtype::Bfloat16);
    let prepared_short = noop.prepare(&one)?;
    let prepared_long = long_noop.prepare(&one)?;
    let short_apply = || Ok(noop.apply_prepared(&[x], &prepared_short)?.remove(0));
    let long_apply = || Ok(long_noop.apply_prepared(&[x], &prepared_long)?.remove(0));
    let build = [
        ("MLX add", per_call(&|| x.add(x))?),
        ("no-op kernel, short source", per_call(&short_apply)?),
        ("no-op kernel, long source", per_call(&long_apply)?),
        (
            "pre-pass + down kernel (partials)",
            per_call(&|| down_cuda_partials(x, layer.lin.codes(), layer.lin.scales(), &g, cfg))?,
        ),
        ("the layer's forward (Cuda path)", per_call(&|| layer.lin.forward_with(x, ForwardPath::Cuda))?),
    ];
    for (what, us) in build {
        println!("probe graph build: {what}: {us:.2} us/call");
    }
    // An MLP's gate and up stored along their outputs: two calls of the layer's shape, or one
    // call of the pair variant (a second matrix of the same geometry, other codes).
    let partner = TrellisLinear::from_host("up", &synthetic_layer(inp, out, g.k, g.l, 0, g.layout(), 0.015, 11)?)?;
    let two = || -> mlx_trellis::Result<Vec<MlxArray>> {
        Ok(vec![layer.lin.forward_with(x, ForwardPath::Cuda)?, partner.forward_with(x, ForwardPath::Cuda)?])
    };
    let pair = || -> mlx_trellis::Result<Vec<MlxArray>> {
        let (a, b) = (&layer.lin, &partner);
        Ok(down_pair_cuda(x, [a.codes(), b.codes()], [a.scales(), b.scales()], &g)?.to_vec())
    };
    let (two_queued, pair_queued) =
        (time_each(args.calls, args.evals, &two)?, time_each(args.calls, args.evals, &pair)?);
    let (two_build, pair_build) = (per_call(&|| Ok(two()?.remove(0)))?, per_call(&|| Ok(pair()?.remove(0)))?);
    println!(
        "probe pair {} M={m}: two calls {:.1} us, one pair call {:.1} us (queued); graph build {two_build:.2} / {pair_build:.2} us",
        layer.name, two_queued.0, pair_queued.0
    );
    let (short_eval, long_eval) =
        (time(args.calls, args.evals, &short_apply)?, time(args.calls, args.evals, &long_apply)?);
    println!(
        "probe queued no-op calls: short source {:.2} us/call, long source {:.2} us/call ({} bytes of header)",
        short_eval.0,
        long_eval.0,
        long_header.len()
    );
    Ok(())
}

/// MLX's fold of f32 partials (`sum` over the splits, then the cast to bf16) in candidate
/// layouts, `[M, S, C]` (the kernel's) and others, for each row count and split count. Each
/// candidate's launches follow a launch of a one-thread marker kernel (`fold_marker`, its N-th
/// launch before table row N), so that a profiler's serialised durations can be attributed.
fn folds(args: &Args) -> Result<()> {
    use mlx_trellis::{random, CudaKernel, KernelSource, LaunchConfig};
    // One marker kernel for every candidate: its N-th launch precedes row N's kernels.
    let marker = CudaKernel::new(
        KernelSource::new("fold_marker", &["inp"], &["out"], "if (threadIdx.x == 0) out[0] = inp[0];"),
        0,
    )?;
    let mark = LaunchConfig::new([1, 1, 1], [1, 1, 1]).output(&[1], Dtype::Float32);
    println!(
        "| M | splits | layout | reduced axes | call median us | call best us | row |\n|---|---|---|---|---|---|---|"
    );
    let mut row = 0;
    let out = args.shape().1;
    for &m in &args.rows.rows {
        for &s in &args.fold_splits {
            let mut candidates: Vec<(String, Vec<usize>, Vec<i32>)> = vec![
                ("[M, S, C]".into(), vec![m, s, out], vec![1]),
                ("[S, M, C]".into(), vec![s, m, out], vec![0]),
                ("[M, C, S]".into(), vec![m, out, s], vec![2]),
            ];
            for s1 in [2, 4] {
                if s % s1 == 0 {
                    candidates.push((format!("[{s1}, M, S/{s1}, C]"), vec![s1, m, s / s1, out], vec![0, 2]));
                }
            }
            for (layout, shape, axes) in candidates {
                let partial = random::normal(&shape, Dtype::Float32, 0.0, 1.0, 5)?;
                partial.eval()?;
                marker.apply(&[&partial], &mark)?[0].eval()?;
                let t = time(args.calls, args.evals, &|| partial.sum_axes(&axes, false)?.astype(Dtype::Bfloat16))?;
                println!("| {m} | {s} | {layout} | {axes:?} | {:.1} | {:.1} | {row} |", t.0, t.1);
                row += 1;
            }
        }
    }
    Ok(())
}
