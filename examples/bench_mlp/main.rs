//! The headline benchmark: the Qwen3-14B MLP (5120 -> 17408 -> 5120) as a model runs it, on a GPU
//! back-end. A residual chain `x <- x + mlp_l(x)` over 8 **distinct** layers (so that no layer's
//! weights stay in the GPU's L2 from one call to the next, as in a 40-layer model), repeated
//! `--rounds` times per evaluation; the figure is time per MLP layer, median (best) of `--evals`
//! evaluations. Contenders in the same run: the trellis MLP at 3 and 2 bits (gate/up fused with
//! the SwiGLU, then the down projection with the residual add in its launch:
//! `TrellisMlp::forward_residual`), MLX's dense bf16 MLP of the same decoded weights (matmul,
//! MLX's silu, multiply, then the down projection and the residual add both ways MLX offers: a
//! matmul and MLX's add, as mlx-lm's models do, and one `addmm`; its figure is the faster of the
//! two at each row count) and MLX's affine 4-bit MLP of them (group 64; quantized matmuls, then
//! MLX's add). Each trellis MLP's first layer is
//! checked against the f64 reference at every row count, with and without the residual.
//!
//! It also times each projection alone in the same cold setting (independent calls over the 8
//! layers in turn): the fused gate·up·SwiGLU and the down projection, beside MLX's bf16 and
//! affine 4-bit matmuls; and the host's part of the trellis and bf16 chains (MLX's `async_eval`,
//! which records and launches an evaluation and returns without waiting for the GPU).
//!
//! With `--ws-down` it also times the chain with the down projection on the warp-specialized
//! GEMM (`down_ws.cu`, which the plan does not take), one and three producer teams, each checked
//! against the f64 reference first: the A/B that decides whether the plan should.
//!
//! With `--pipelined` it also times each chain as a model runner's decode loop evaluates its
//! tokens: every evaluation is built and started before the one before it is waited for, so the
//! host's building and recording, the first graph's wait and the final synchronisation overlap
//! the GPU's work on the previous evaluation. The difference from the headline is the fixed cost
//! of one synchronous evaluation, spread over its layers.
//!
//! With `--ws-stages N,...` it times the chain with the fused gate·up·SwiGLU on the
//! warp-specialized GEMM at each of those ring depths too, where the plan takes that GEMM.
//!
//! With `--down-configs "CFG; ..."` it times each width's chain with the down projection on each
//! of those down-kernel configurations (`bench_down --configs`'s text form), beside the plan's own
//! configuration called the same way: a plan change's A/B in one binary and one process.
//!
//! `--help` lists every option, with examples.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::trellis::cuda::expand::expand_cuda;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, parse_down_configs, swiglu_with, AxisOneConfig, AxisOneKernel, CudaDownConfig,
};
use mlx_trellis::trellis::reference::{mlp_forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_mlp, synthetic_mlp_axis_one, CodeLayout, HostLayer, TrellisLinear, TrellisMlp};
use mlx_trellis::{backend, Backend, Dtype, MlxArray};

#[path = "../common/cli.rs"]
mod cli;
#[path = "../common/exit.rs"]
mod exit;
#[path = "../common/graphs.rs"]
mod graphs;
#[path = "../common/plot.rs"]
mod plot;
#[path = "../common/tp_bench.rs"]
mod tp_bench;

mod dense;
mod plot_json;
mod tables;
mod timing;
mod variants;

use dense::{bf16_mlp_residual, dense_twin, q4_matmul, q4_mlp, Bf16Residual, Dense};
use tables::print_tables;
use timing::{host_time, time, time_pipelined};
use variants::{down_config_rows, int8_rows, int8_serves, ws_down_rows, ws_stages_rows};

const HIDDEN: usize = 5120;
const INTER: usize = 17408;
const LAYERS: usize = 8;

/// The headline benchmark: the Qwen3-14B MLP (5120 -> 17408 -> 5120) as a model runs it, on MLX's
/// CUDA back-end.
///
/// A residual chain x <- x + mlp_l(x) over 8 distinct layers (so that no layer's weights stay in
/// the GPU's L2 from one call to the next, as in a 40-layer model), --rounds times per
/// evaluation; the figure is time per MLP layer, median (best) of --evals evaluations.
/// Contenders in the same run: the trellis MLP at each --bits width (the residual added in its
/// down kernel's launch), MLX's dense bf16 MLP of the same decoded weights (the faster of a
/// matmul then MLX's add, and addmm) and MLX's affine 4-bit MLP of them (group 64); unless
/// --no-alone, each projection alone as well. A second table gives the host's part of each
/// chain (MLX's async_eval, which records and launches it without waiting for the GPU). Each
/// trellis MLP's first layer is checked against the f64 reference at every row count, with and
/// without the residual. With --tp N every layer is split over N processes (one all-reduce per
/// layer) and timed beside the unsharded chain. Exit status: 0 every check passed, 1 a check
/// missed its gate, 2 an error (including a back-end other than CUDA for the single-process run).
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo build --release --features tuning --example bench_mlp
  target/release/examples/bench_mlp --bits 3 --evals 8 --rounds 2 --json out.json
  target/release/examples/bench_mlp --plot out.json docs/bench_mlp_h200.svg     # the plot of a JSON table
  target/release/examples/bench_mlp --bits 3 --rows 65,96,128 --ws-down          # the down kernels' A/B
  target/release/examples/bench_mlp --bits 3,2 --no-alone --pipelined           # plus a decode loop's steady state
  target/release/examples/bench_mlp --bits 3 --rows 64,128 --ws-stages 5,7 --no-alone  # ring depths' A/B
  target/release/examples/bench_mlp --bits 3,2 --rows 5,8 --no-alone --down-configs \"nc2 mt1 ks4 w8 s13 st4 prescaled mbar\"
  target/release/examples/bench_mlp --tp 1 --backend nccl                       # one GPU: the sharded path's overhead
  target/release/examples/bench_mlp --tp 2 --backend nccl --rows 1,8,64
  target/release/examples/bench_mlp --tp 2 --backend ring --hidden 1024 --inter 2048 --layers 2 --rows 1 --evals 3")]
struct Cli {
    #[command(flatten)]
    rows: cli::BenchRows,
    /// Bit widths of the trellis MLPs, comma-separated; the dense contenders decode the first
    /// [default: 3,2; with --tp one width, 3]
    #[arg(long, value_name = "K,...", value_delimiter = ',', value_parser = cli::bits)]
    bits: Option<Vec<u32>>,
    /// Passes over the layers per evaluation
    #[arg(long, value_name = "R", value_parser = cli::positive, default_value_t = 4)]
    rounds: usize,
    /// Timed evaluations (after one warm-up)
    #[arg(long, value_name = "E", value_parser = cli::positive, default_value_t = 20)]
    evals: usize,
    /// Write the table as JSON to this file
    #[arg(long, value_name = "FILE", conflicts_with = "tp")]
    json: Option<String>,
    /// Skip timing each projection alone
    #[arg(long = "no-alone", conflicts_with = "tp")]
    no_alone: bool,
    /// Also time the first bit width's chain with its down projection on the warp-specialized
    /// GEMM (`down_ws.cu`, not planned; Hopper only), with one and with three producer teams
    #[arg(long = "ws-down", conflicts_with = "tp")]
    ws_down: bool,
    /// Also time the first bit width's chain with the fused gate·up·SwiGLU on the
    /// warp-specialized GEMM at each of these ring depths (4..=7 steps), at the rows whose plan
    /// takes that GEMM
    #[arg(long = "ws-stages", value_delimiter = ',', conflicts_with = "tp")]
    ws_stages: Vec<u32>,
    /// Also time each chain (trellis at every width, MLX bf16 with matmul then add, MLX affine
    /// 4-bit) with pipelined evaluations, as a decode loop runs its tokens: each evaluation
    /// started (async_eval) before the one before it is waited for; the time between two
    /// evaluations' ends, median, and the run's mean (first end to last)
    #[arg(long, conflicts_with = "tp")]
    pipelined: bool,
    /// Also time the first bit width's chain with the fused gate·up·SwiGLU on the int8 kernel
    /// (`gate_up_int8.cu`, not planned) at the rows it serves, beside the planned kernel called
    /// the same way (no hand-over of the down kernel's counters)
    #[arg(long, conflicts_with = "tp")]
    int8: bool,
    /// Also time each width's chain with its down projection (and the residual add) on each of
    /// these down-kernel configurations instead of the plan (separated by `;`, each as
    /// `bench_down --configs` takes them, e.g. "nc2 mt1 ks4 w8 s13 st4 prescaled mbar"), beside
    /// the plan's own configuration called the same way (the swiglu unfed, so the down call
    /// prepares its own counters); configurations that do not fit the layer are skipped
    #[arg(long = "down-configs", value_name = "LIST", value_parser = parse_down_configs, conflicts_with = "tp")]
    // The path spelled out: clap's derive takes a bare `Vec` for a list of separate values.
    down_configs: Option<::std::vec::Vec<CudaDownConfig>>,
    /// The axis the down projections are coded along: 0 (stored `[in, out]`, the Qwen layout
    /// mlx-bun writes, 3 bits in the block interleave; the down kernel `down_mma.cu`) or 1
    /// (stored `[out, in]` row-major like gate and up, as QTIP and EXL3 store them; the axis-1
    /// kernels with the residual in their launch)
    #[arg(long = "down-axis", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1),
          conflicts_with_all = ["tp", "ws_down"])]
    down_axis: u32,
    /// Draw the plot of a JSON table (from --json) as SVG, and exit
    #[arg(long, num_args = 2, value_names = ["JSON", "SVG"], conflicts_with = "tp")]
    plot: Option<Vec<String>>,
    #[command(flatten)]
    tp: tp_bench::TpArgs,
}

struct Args {
    rows: Vec<usize>,
    bits: Vec<u32>,
    rounds: usize,
    evals: usize,
    json: Option<String>,
    plot: Option<(String, String)>,
    alone: bool,
    ws_down: bool,
    ws_stages: Vec<u32>,
    int8: bool,
    pipelined: bool,
    down_configs: Vec<CudaDownConfig>,
    down_axis: u32,
}

fn parse(c: &Cli) -> Args {
    Args {
        rows: c.rows.rows.clone(),
        bits: c.bits.clone().unwrap_or_else(|| vec![3, 2]),
        rounds: c.rounds,
        evals: c.evals,
        json: c.json.clone(),
        plot: c.plot.as_ref().map(|p| (p[0].clone(), p[1].clone())),
        alone: !c.no_alone,
        ws_down: c.ws_down,
        ws_stages: c.ws_stages.clone(),
        int8: c.int8,
        pipelined: c.pipelined,
        down_configs: c.down_configs.clone().unwrap_or_default(),
        down_axis: c.down_axis,
    }
}

/// The first layer's output `y` against the f64 reference `want` at `m` rows: its line in
/// `checks` (`what` names the contender) and its relErr, or the gate's miss where an output is
/// not finite or the relErr reaches 1e-2.
fn gate_first_layer(checks: &mut String, what: &str, m: usize, y: &MlxArray, want: &[f64]) -> Result<f64> {
    let got = to_f64(y)?;
    let e = rel_err(&got, want)?;
    if !got.iter().all(|v| v.is_finite()) || e >= 1e-2 {
        let _ = writeln!(checks, "| {what} | {m} | {e:.1e} | FAILED |");
        let miss = format!("{what} M {m}: the trellis MLP's relErr against the f64 reference {e:.3e}");
        return Err(exit::GateMissed(miss).into());
    }
    let _ = writeln!(checks, "| {what} | {m} | {e:.1e} | ok |");
    Ok(e)
}

/// The chain a variant runs in: the first bit width's layers, the input `x` of `m` rows and the
/// f64 reference of the first layer's output with the residual.
struct ChainCase<'a> {
    layers: &'a [TrellisMlp],
    x: &'a MlxArray,
    m: usize,
    want_residual: &'a [f64],
    args: &'a Args,
}

/// One variant of the trellis chain, `step` giving the residual stream after a layer: its first
/// layer against the f64 reference, then its time per layer as the row `trellis {name}`.
fn chain_variant(
    c: &ChainCase,
    name: &str,
    step: &dyn Fn(&TrellisMlp, &MlxArray) -> mlx_trellis::Result<MlxArray>,
    rows: &mut Vec<Row>,
    checks: &mut String,
) -> Result<()> {
    let ChainCase { layers, x, m, want_residual, args } = *c;
    let e = gate_first_layer(checks, &format!("{name} with the residual"), m, &step(&layers[0], x)?, want_residual)?;
    let (med, best) = time(args.evals, args.rounds * LAYERS, &|| chain(layers, args.rounds, x, step))?;
    rows.push(Row { m, name: format!("trellis {name}"), median: med, best });
    eprintln!("[bench] trellis, {name}, M={m}: {med:.1} us per MLP layer, relErr {e:.1e}");
    Ok(())
}

/// The residual chain over `layers`, `rounds` times: `x <- step(layer, x)`, each step giving
/// the residual stream after its layer (`x + mlp(x)`).
fn chain<L>(
    layers: &[L],
    rounds: usize,
    x: &MlxArray,
    step: &dyn Fn(&L, &MlxArray) -> mlx_trellis::Result<MlxArray>,
) -> mlx_trellis::Result<Vec<MlxArray>> {
    let mut x = x.clone();
    for _ in 0..rounds {
        for l in layers {
            x = step(l, &x)?;
        }
    }
    Ok(vec![x])
}

/// Independent calls of one projection over the layers in turn, `rounds` times.
fn alone<L>(
    layers: &[L],
    rounds: usize,
    f: &dyn Fn(&L) -> mlx_trellis::Result<MlxArray>,
) -> mlx_trellis::Result<Vec<MlxArray>> {
    let mut outs = Vec::new();
    for _ in 0..rounds {
        for l in layers {
            outs.push(f(l)?);
        }
    }
    Ok(outs)
}

/// Layer `l` of the benchmark's chain at `k` bits, its down projection on `down_axis` (axis 0: in
/// the 3-bit interleave at 3 bits, else row-major; axis 1: row-major), seeded so that every run
/// and every `--tp` rank builds the same bits; with its host copy.
fn seeded_mlp(
    l: usize,
    k: u32,
    hidden: usize,
    inter: usize,
    down_axis: u32,
) -> Result<(TrellisMlp, (HostLayer, HostLayer, HostLayer))> {
    let seed = 1000 * k as u64 + l as u64;
    let h = if down_axis == 1 {
        synthetic_mlp_axis_one(hidden, inter, k, seed)?
    } else {
        let layout = if k == 3 { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor };
        synthetic_mlp(hidden, inter, k, layout, seed)?
    };
    let lin = |name: &str, h: &HostLayer| TrellisLinear::from_host(&format!("model.layers.{l}.mlp.{name}"), h);
    let mlp = TrellisMlp::new(lin("gate_proj", &h.0)?, lin("up_proj", &h.1)?, lin("down_proj", &h.2)?)?;
    Ok((mlp, h))
}

fn to_f64(a: &MlxArray) -> Result<Vec<f64>> {
    Ok(a.astype(Dtype::Float32)?.to_vec::<f32>()?.into_iter().map(f64::from).collect())
}

struct Row {
    m: usize,
    name: String,
    median: f64,
    best: f64,
}

fn main() -> ExitCode {
    graphs::start();
    let cli = Cli::parse();
    let result = if cli.tp.tp.is_some() { tp_bench::run(&cli) } else { bench(&cli) };
    exit::finish(result.map(|()| true), "[bench] a check missed its gate (see above)")
}

fn bench(cli: &Cli) -> Result<()> {
    let args = parse(cli);
    if let Some((json, svg)) = &args.plot {
        return plot_json::write(json, svg);
    }
    if backend() != Backend::Cuda {
        bail!("bench_mlp times the CUDA kernels; this MLX build's back-end is {}", backend());
    }
    if args.down_axis == 1 && !args.down_configs.is_empty() {
        bail!("--down-configs configures the axis-0 down kernel; --down-axis 1 runs the axis-1 kernels");
    }
    let max_m = *args.rows.iter().max().context("no rows")?;
    let x_all = MlxArray::from_slice(&gaussian(max_m * HIDDEN, 99)?, &[max_m, HIDDEN])?.astype(Dtype::Bfloat16)?;
    x_all.eval()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut checks = String::new();
    let mut dense: Option<Vec<Dense>> = None;
    for (bi, &k) in args.bits.iter().enumerate() {
        let t = Instant::now();
        let mut hosts: Vec<(HostLayer, HostLayer, HostLayer)> = Vec::new();
        let mut layers = Vec::new();
        for l in 0..LAYERS {
            let (mlp, h) = seeded_mlp(l, k, HIDDEN, INTER, args.down_axis)?;
            layers.push(mlp);
            if l == 0 {
                hosts.push(h);
            }
        }
        eprintln!("[bench] built {LAYERS} k{k} MLP layers in {:.1} s", t.elapsed().as_secs_f64());
        // The dense contenders are the 3-bit layers' decoded weights (the first bit width).
        if bi == 0 {
            let t = Instant::now();
            dense = Some(layers.iter().map(dense_twin).collect::<Result<_>>()?);
            eprintln!("[bench] decoded their bf16 and affine 4-bit twins in {:.1} s", t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let h = &hosts[0];
        let want = mlp_forward_f64(&to_f64(&x_all)?, max_m, &h.0, &h.1, &h.2)?;
        eprintln!("[bench] f64 reference of layer 0 ({max_m} rows) in {:.1} s", t.elapsed().as_secs_f64());
        for &m in &args.rows {
            let x = x_all.slice(&[0, 0], &[m as i32, HIDDEN as i32], &[1, 1])?.contiguous()?;
            x.eval()?;
            // The MLP, and the residual stream after it (x + mlp(x), the add in the down launch).
            let x64 = to_f64(&x)?;
            let want_residual: Vec<f64> = x64.iter().zip(&want[..m * HIDDEN]).map(|(a, b)| a + b).collect();
            let mut err = 0.0f64;
            for (what, y, want) in [
                ("", layers[0].forward(&x)?, &want[..m * HIDDEN]),
                (" with the residual", layers[0].forward_residual(&x, &x)?, &want_residual[..]),
            ] {
                err = err.max(gate_first_layer(&mut checks, &format!("k{k}{what}"), m, &y, want)?);
            }
            let steps = args.rounds * LAYERS;
            let step = |l: &TrellisMlp, x: &MlxArray| l.forward_residual(x, x);
            let (med, best) = time(args.evals, steps, &|| chain(&layers, args.rounds, &x, &step))?;
            rows.push(Row { m, name: format!("trellis k{k}"), median: med, best });
            let host = host_time(args.evals, steps, &|| chain(&layers, args.rounds, &x, &step))?;
            rows.push(Row { m, name: format!("trellis k{k} host"), median: host, best: host });
            if args.pipelined {
                let p = time_pipelined(args.evals, steps, &|| chain(&layers, args.rounds, &x, &step))?;
                rows.push(Row { m, name: format!("trellis k{k} pipelined"), median: p.median, best: p.best });
                rows.push(Row { m, name: format!("trellis k{k} pipelined mean"), median: p.mean, best: p.mean });
            }
            eprintln!("[bench] trellis k{k} M={m}: {med:.1} us per MLP layer ({host:.1} of them the host's), relErr {err:.1e}");
            let case = ChainCase { layers: &layers, x: &x, m, want_residual: &want_residual, args: &args };
            if args.ws_down && bi == 0 {
                ws_down_rows(&case, &mut rows, &mut checks)?;
            }
            if !args.ws_stages.is_empty() && bi == 0 {
                ws_stages_rows(&case, &mut rows, &mut checks)?;
            }
            if args.int8 && bi == 0 {
                int8_rows(&case, &mut rows, &mut checks)?;
            }
            if !args.down_configs.is_empty() {
                down_config_rows(&case, k, &mut rows, &mut checks)?;
            }
            // Each projection alone for the first bit width only (the 3-bit layers by default).
            if args.alone && bi == 0 {
                let (med, best) = time(args.evals, steps, &|| {
                    alone(&layers, args.rounds, &|l| l.swiglu_with(&x, mlx_trellis::trellis::ForwardPath::Auto))
                })?;
                rows.push(Row { m, name: format!("trellis k{k} gate·up·SwiGLU alone"), median: med, best });
                let h = layers[0].swiglu_with(&x, mlx_trellis::trellis::ForwardPath::Auto)?;
                h.eval()?;
                let (med, best) = time(args.evals, steps, &|| alone(&layers, args.rounds, &|l| l.down().forward(&h)))?;
                rows.push(Row { m, name: format!("trellis k{k} down alone"), median: med, best });
                // The int8 kernel (not planned) beside the planned fused kernel where it serves the
                // rows; where the planned path switches, both sides of the switch.
                let int8 = AxisOneConfig::plain(AxisOneKernel::Int8);
                if int8_serves(m) {
                    let fused = |l: &TrellisMlp| swiglu_with(&x, l.gate(), l.up(), int8);
                    let (med, best) = time(args.evals, steps, &|| alone(&layers, args.rounds, &fused))?;
                    rows.push(Row { m, name: format!("trellis k{k} gate·up int8 kernel alone"), median: med, best });
                }
                if m >= 17 {
                    let fused = |l: &TrellisMlp| {
                        swiglu_with(&x, l.gate(), l.up(), axis_one_plan(m, Dtype::Bfloat16, true, INTER))
                    };
                    let (med, best) = time(args.evals, steps, &|| alone(&layers, args.rounds, &fused))?;
                    rows.push(Row { m, name: format!("trellis k{k} gate·up fused kernel alone"), median: med, best });
                    let dense = |l: &TrellisMlp| -> mlx_trellis::Result<MlxArray> {
                        let w = |p: &TrellisLinear| expand_cuda(p.codes(), p.scales(), p.geometry(), Dtype::Bfloat16);
                        x.matmul(&w(l.gate())?.t()?)?.silu()?.multiply(&x.matmul(&w(l.up())?.t()?)?)
                    };
                    let (med, best) = time(args.evals, steps, &|| alone(&layers, args.rounds, &dense))?;
                    rows.push(Row { m, name: format!("trellis k{k} gate·up dense path alone"), median: med, best });
                }
            }
            if bi == 0 {
                let dense = dense.as_ref().expect("built with the first bit width");
                // MLX's bf16 MLP both ways it can add the residual; its figure is the faster.
                let mut fastest: Option<Row> = None;
                for how in [Bf16Residual::Add, Bf16Residual::Addmm] {
                    let bf16 = |d: &Dense, x: &MlxArray| bf16_mlp_residual(d, x, how);
                    let (med, best) = time(args.evals, steps, &|| chain(dense, args.rounds, &x, &bf16))?;
                    if fastest.as_ref().is_none_or(|f| med < f.median) {
                        fastest = Some(Row { m, name: "MLX bf16".into(), median: med, best });
                    }
                    rows.push(Row { m, name: how.name().into(), median: med, best });
                }
                rows.extend(fastest);
                let bf16 = |d: &Dense, x: &MlxArray| bf16_mlp_residual(d, x, Bf16Residual::Add);
                let host = host_time(args.evals, steps, &|| chain(dense, args.rounds, &x, &bf16))?;
                rows.push(Row { m, name: "MLX bf16 (matmul, add) host".into(), median: host, best: host });
                let q4 = |d: &Dense, x: &MlxArray| x.add(&q4_mlp(d, x)?);
                let (med, best) = time(args.evals, steps, &|| chain(dense, args.rounds, &x, &q4))?;
                rows.push(Row { m, name: "MLX affine 4-bit".into(), median: med, best });
                if args.pipelined {
                    for (name, f) in [
                        ("MLX bf16 pipelined", &bf16 as &dyn Fn(&Dense, &MlxArray) -> mlx_trellis::Result<MlxArray>),
                        ("MLX affine 4-bit pipelined", &q4),
                    ] {
                        let p = time_pipelined(args.evals, steps, &|| chain(dense, args.rounds, &x, f))?;
                        rows.push(Row { m, name: name.into(), median: p.median, best: p.best });
                        rows.push(Row { m, name: format!("{name} mean"), median: p.mean, best: p.mean });
                    }
                }
                if args.alone {
                    let h = layers[0].swiglu_with(&x, mlx_trellis::trellis::ForwardPath::Auto)?;
                    h.eval()?;
                    for (name, f) in [
                        ("MLX bf16 gate+up+silu alone", &|d: &Dense| -> mlx_trellis::Result<MlxArray> {
                            x.matmul(&d.w[0].t()?)?.silu()?.multiply(&x.matmul(&d.w[1].t()?)?)
                        }
                            as &dyn Fn(&Dense) -> mlx_trellis::Result<MlxArray>),
                        ("MLX bf16 down alone", &|d: &Dense| h.matmul(&d.w[2].t()?)),
                        ("MLX affine 4-bit down alone", &|d: &Dense| q4_matmul(&d.q4[2], &h)),
                    ] {
                        let (med, best) = time(args.evals, steps, &|| alone(dense, args.rounds, f))?;
                        rows.push(Row { m, name: name.into(), median: med, best });
                    }
                }
                eprintln!("[bench] MLX M={m} done");
            }
        }
    }
    print_tables(&args, &rows, &checks)?;
    Ok(())
}
