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
//! `--help` lists every option, with examples.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::trellis::cuda::expand::expand_cuda;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, down_ws_cuda_with, swiglu_with, AxisOneConfig, AxisOneKernel, CudaDownWsConfig, INT8_MAX_ROWS,
};
use mlx_trellis::trellis::reference::{mlp_forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{synthetic_mlp, synthetic_mlp_axis_one, CodeLayout, HostLayer, TrellisLinear, TrellisMlp};
use mlx_trellis::{async_eval_all, backend, eval_all, quantize, quantized_matmul, Backend, Dtype, MlxArray};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;
#[path = "common/graphs.rs"]
mod graphs;
#[path = "common/plot.rs"]
mod plot;
#[path = "common/tp_bench.rs"]
mod tp_bench;

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
    /// evaluations' ends, median (best)
    #[arg(long, conflicts_with = "tp")]
    pipelined: bool,
    /// Also time the first bit width's chain with the fused gate·up·SwiGLU on the int8 kernel
    /// (`gate_up_int8.cu`, not planned) at the rows it serves, beside the planned kernel called
    /// the same way (no hand-over of the down kernel's counters)
    #[arg(long, conflicts_with = "tp")]
    int8: bool,
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

/// How MLX's bf16 MLP adds the residual stream after its down projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bf16Residual {
    /// A matmul, then MLX's add (as mlx-lm's models do).
    Add,
    /// `addmm`: one call (on CUDA, cuBLAS with the add in its epilogue).
    Addmm,
}

impl Bf16Residual {
    /// The contender's name in the tables and the JSON.
    fn name(self) -> &'static str {
        match self {
            Bf16Residual::Add => "MLX bf16 (matmul, add)",
            Bf16Residual::Addmm => "MLX bf16 (addmm)",
        }
    }
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
        down_axis: c.down_axis,
    }
}

/// The dense twin of one trellis layer: `[out, in]` bf16 weights of each projection (as
/// `nn.Linear` stores them) and their affine 4-bit quantization.
struct Dense {
    w: [MlxArray; 3],
    q4: [(MlxArray, MlxArray, MlxArray); 3],
}

fn dense_twin(mlp: &TrellisMlp) -> Result<Dense> {
    let gate = expand_cuda(mlp.gate().codes(), mlp.gate().scales(), mlp.gate().geometry(), Dtype::Bfloat16)?;
    let up = expand_cuda(mlp.up().codes(), mlp.up().scales(), mlp.up().geometry(), Dtype::Bfloat16)?;
    // A down projection stored [in, out] (axis 0) has its nn.Linear weight as the transpose.
    let down = expand_cuda(mlp.down().codes(), mlp.down().scales(), mlp.down().geometry(), Dtype::Bfloat16)?;
    let down = if mlp.down().geometry().axis == 0 { down.t()?.contiguous()? } else { down };
    let w = [gate, up, down];
    eval_all(&w.iter().collect::<Vec<_>>())?;
    let q4 = [quantize(&w[0], 64, 4)?, quantize(&w[1], 64, 4)?, quantize(&w[2], 64, 4)?];
    eval_all(&q4.iter().flat_map(|(a, b, c)| [a, b, c]).collect::<Vec<_>>())?;
    Ok(Dense { w, q4 })
}

/// The residual stream after MLX's bf16 MLP of `x`: `x + mlp(x)`, the add as `how` says.
fn bf16_mlp_residual(d: &Dense, x: &MlxArray, how: Bf16Residual) -> mlx_trellis::Result<MlxArray> {
    let g = x.matmul(&d.w[0].t()?)?;
    let u = x.matmul(&d.w[1].t()?)?;
    let h = g.silu()?.multiply(&u)?;
    match how {
        Bf16Residual::Addmm => x.addmm(&h, &d.w[2].t()?),
        Bf16Residual::Add => x.add(&h.matmul(&d.w[2].t()?)?),
    }
}

fn q4_matmul(q: &(MlxArray, MlxArray, MlxArray), x: &MlxArray) -> mlx_trellis::Result<MlxArray> {
    quantized_matmul(x, &q.0, &q.1, &q.2, true, 64, 4)
}

fn q4_mlp(d: &Dense, x: &MlxArray) -> mlx_trellis::Result<MlxArray> {
    let g = q4_matmul(&d.q4[0], x)?;
    let u = q4_matmul(&d.q4[1], x)?;
    q4_matmul(&d.q4[2], &g.silu()?.multiply(&u)?)
}

/// Median and best microseconds per step of `steps` built by `f` (one evaluation each).
fn time(evals: usize, steps: usize, f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>) -> Result<(f64, f64)> {
    let run = || -> Result<f64> {
        let outs = f()?;
        let t = Instant::now();
        eval_all(&outs.iter().collect::<Vec<_>>())?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / steps as f64)
    };
    run()?; // warm-up: kernel compilation, caches, allocator
    let mut v = (0..evals).map(|_| run()).collect::<Result<Vec<_>>>()?;
    v.sort_by(f64::total_cmp);
    Ok((v[v.len() / 2], v[0]))
}

/// Microseconds per step of each of `evals` evaluations of `steps` built by `f`, evaluated as a
/// decode loop evaluates its tokens: each evaluation is built and started (`async_eval`) before the one
/// before it is waited for, so the host's work on the next overlaps the GPU's on this one (the
/// GPU runs them in order on one stream). An evaluation's time is the time between its end and
/// the end of the one before it.
fn time_pipelined(evals: usize, steps: usize, f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>) -> Result<Vec<f64>> {
    let start = || -> Result<Vec<MlxArray>> {
        let outs = f()?;
        async_eval_all(&outs.iter().collect::<Vec<_>>())?;
        Ok(outs)
    };
    let wait = |outs: &[MlxArray]| eval_all(&outs.iter().collect::<Vec<_>>());
    wait(&f()?)?; // warm-up: kernel compilation, caches, allocator
    let mut current = start()?;
    let mut last_end: Option<Instant> = None;
    let mut v = Vec::with_capacity(evals);
    while v.len() < evals {
        let next = start()?;
        wait(&current)?;
        let end = Instant::now();
        if let Some(t) = last_end {
            v.push((end - t).as_secs_f64() * 1e6 / steps as f64);
        }
        last_end = Some(end);
        current = next;
    }
    wait(&current)?;
    Ok(v)
}

/// [`time_pipelined`]'s median and best.
fn median_best(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// Median microseconds per step of the host's part of an evaluation of `steps` built by `f`: how
/// long MLX's `async_eval` takes to record and launch it (it returns without waiting for the
/// GPU), each evaluation then waited for before the next. Where it is close to [`time`]'s
/// figure, the chain waits for the host, not for the GPU.
fn host_time(evals: usize, steps: usize, f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>) -> Result<f64> {
    let run = || -> Result<f64> {
        let outs = f()?;
        let refs: Vec<&MlxArray> = outs.iter().collect();
        let t = Instant::now();
        async_eval_all(&refs)?;
        let host = t.elapsed().as_secs_f64() * 1e6 / steps as f64;
        eval_all(&refs)?;
        Ok(host)
    };
    run()?;
    let mut v = (0..evals).map(|_| run()).collect::<Result<Vec<_>>>()?;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
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

/// The first bit width's chain with each layer's down projection (and the residual add) on the
/// warp-specialized GEMM (`down_ws.cu`), one and three producer teams: the first layer against
/// the f64 reference (`want_residual`), then the chain, and with `args.alone` the down
/// projection alone.
fn ws_down_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
    let ChainCase { layers, x, m, args, .. } = *c;
    let auto = mlx_trellis::trellis::ForwardPath::Auto;
    let h = layers[0].swiglu_with(x, auto)?;
    h.eval()?;
    for teams in [1, 3] {
        let cfg = CudaDownWsConfig::with_teams(m, teams);
        let down = |l: &TrellisMlp, h: &MlxArray, residual: Option<&MlxArray>| {
            let d = l.down();
            down_ws_cuda_with(h, d.codes(), d.scales(), d.geometry(), cfg, residual)
        };
        let step = |l: &TrellisMlp, x: &MlxArray| down(l, &l.swiglu_with(x, auto)?, Some(x));
        let name = format!("ws down, {teams} team{}", if teams == 1 { "" } else { "s" });
        chain_variant(c, &name, &step, rows, checks)?;
        if args.alone {
            let steps = args.rounds * LAYERS;
            let (med, best) = time(args.evals, steps, &|| alone(layers, args.rounds, &|l| down(l, &h, None)))?;
            rows.push(Row { m, name: format!("trellis {name} alone"), median: med, best });
        }
    }
    Ok(())
}

/// The first bit width's chain with the fused gate·up·SwiGLU on the warp-specialized GEMM at
/// each of `args.ws_stages` ring depths (the plan's configuration otherwise), where the plan
/// takes that GEMM: the first layer against the f64 reference, then the chain.
fn ws_stages_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
    let ChainCase { m, args, .. } = *c;
    let planned = axis_one_plan(m, Dtype::Bfloat16, true, INTER);
    if planned.kernel != AxisOneKernel::Specialized {
        eprintln!("[bench] --ws-stages: the plan at {m} rows is not the warp-specialized GEMM");
        return Ok(());
    }
    for &stages in &args.ws_stages {
        let cfg = AxisOneConfig { stages, ..planned };
        if let Err(e) = cfg.check(Dtype::Bfloat16, true) {
            eprintln!("[bench] --ws-stages {stages} at {m} rows: {e}");
            continue;
        }
        let step = |l: &TrellisMlp, x: &MlxArray| l.down().forward_residual(&swiglu_with(x, l.gate(), l.up(), cfg)?, x);
        chain_variant(c, &format!("ws, {stages} stages"), &step, rows, checks)?;
    }
    Ok(())
}

/// Whether the int8 kernel serves `m` rows of the layer's inputs (its row limit, and its tables
/// within a thread block's shared memory).
fn int8_serves(m: usize) -> bool {
    m <= INT8_MAX_ROWS && AxisOneConfig::plain(AxisOneKernel::Int8).int8_shared_bytes(m, HIDDEN, true).is_some()
}

/// --int8: the chain with the fused gate·up·SwiGLU on the int8 kernel and, for a like-for-like
/// comparison, on the planned kernel through the same call (neither hands the down kernel its
/// counters, so the down projection's own launch prepares them), where the int8 kernel serves
/// the rows.
fn int8_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
    let m = c.m;
    let int8 = AxisOneConfig::plain(AxisOneKernel::Int8);
    if !int8_serves(m) {
        eprintln!("[bench] --int8: the int8 kernel does not serve {m} rows of {HIDDEN} inputs");
        return Ok(());
    }
    let planned = axis_one_plan(m, Dtype::Bfloat16, true, INTER);
    for (name, cfg) in [("gate·up planned, unfed", planned), ("gate·up int8, unfed", int8)] {
        let step = |l: &TrellisMlp, x: &MlxArray| l.down().forward_residual(&swiglu_with(x, l.gate(), l.up(), cfg)?, x);
        chain_variant(c, name, &step, rows, checks)?;
    }
    Ok(())
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
                let (med, best) =
                    median_best(time_pipelined(args.evals, steps, &|| chain(&layers, args.rounds, &x, &step))?);
                rows.push(Row { m, name: format!("trellis k{k} pipelined"), median: med, best });
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
                        let (med, best) =
                            median_best(time_pipelined(args.evals, steps, &|| chain(dense, args.rounds, &x, f))?);
                        rows.push(Row { m, name: name.into(), median: med, best });
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

/// The timed row of `m` activation rows named `name`, if that contender ran.
fn row_of<'a>(rows: &'a [Row], m: usize, name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.m == m && r.name == name)
}

/// The ring depth the plan gives the warp-specialized GEMM (at 128 rows, fused).
fn plan_ws_stages() -> u32 {
    axis_one_plan(128, Dtype::Bfloat16, true, INTER).stages
}

/// The first bit width's chain against its `variants` (each a column header and the row name it
/// was timed under), µs per MLP layer, median (best), and the planned path's time over each;
/// row counts where no variant ran are left out.
fn variant_table(args: &Args, rows: &[Row], title: &str, variants: &[(String, String)]) {
    let get = |m: usize, name: &str| row_of(rows, m, name);
    println!("\n{title}, µs per MLP layer, median (best), and against the planned path");
    let mut header = "| M | planned |".to_string();
    let mut rule = "|---|---|".to_string();
    for (column, _) in variants {
        let _ = write!(header, " {column} | vs planned |");
        rule.push_str("---|---|");
    }
    println!("{header}\n{rule}");
    for &m in &args.rows {
        let Some(planned) = get(m, &format!("trellis k{}", args.bits[0])) else { continue };
        let mut line = format!("| {m} | {:.1} ({:.1}) |", planned.median, planned.best);
        let mut any = false;
        for (_, name) in variants {
            match get(m, name) {
                Some(t) => {
                    any = true;
                    let _ = write!(line, " {:.1} ({:.1}) | {:.2}x |", t.median, t.best, planned.median / t.median);
                }
                None => line.push_str(" - | - |"),
            }
        }
        if any {
            println!("{line}");
        }
    }
}

/// A markdown table's header and rule: the `lead` columns, then `per_width`'s for each bit width.
fn table_head(lead: &[&str], bits: &[u32], per_width: impl Fn(u32) -> Vec<String>) -> String {
    let columns: Vec<String> =
        lead.iter().map(|c| c.to_string()).chain(bits.iter().flat_map(|&k| per_width(k))).collect();
    format!("| {} |\n|{}", columns.join(" | "), "---|".repeat(columns.len()))
}

/// The chains with pipelined evaluations (`--pipelined`) beside the headline's synchronous ones.
fn pipelined_table(args: &Args, rows: &[Row]) {
    let get = |m: usize, name: &str| row_of(rows, m, name);
    println!(
        "\nPipelined evaluations (each started before the one before it is waited for, as a decode loop runs its tokens; MLX bf16 with matmul then add), µs per MLP layer, median (best), and the synchronous evaluation's median"
    );
    let lead = ["M", "MLX bf16", "sync", "MLX affine 4-bit", "sync"];
    println!("{}", table_head(&lead, &args.bits, |k| vec![format!("trellis k{k}"), "sync".into(), "vs bf16".into()]));
    let cell = |r: Option<&Row>| r.map_or("-".to_string(), |r| format!("{:.1} ({:.1})", r.median, r.best));
    let median = |r: Option<&Row>| r.map_or("-".to_string(), |r| format!("{:.1}", r.median));
    for &m in &args.rows {
        let Some(bf) = get(m, "MLX bf16 pipelined") else { continue };
        let mut line = format!(
            "| {m} | {} | {} | {} | {} |",
            cell(Some(bf)),
            median(get(m, Bf16Residual::Add.name())),
            cell(get(m, "MLX affine 4-bit pipelined")),
            median(get(m, "MLX affine 4-bit"))
        );
        for k in &args.bits {
            let t = get(m, &format!("trellis k{k} pipelined"));
            let ratio = t.map_or("-".to_string(), |t| format!("{:.2}x", bf.median / t.median));
            let _ = write!(line, " {} | {} | {ratio} |", cell(t), median(get(m, &format!("trellis k{k}"))));
        }
        println!("{line}");
    }
}

fn print_tables(args: &Args, rows: &[Row], checks: &str) -> Result<()> {
    let get = |m: usize, name: &str| row_of(rows, m, name);
    println!(
        "Qwen3-14B MLP {HIDDEN} -> {INTER} -> {HIDDEN}, bf16 activations{}, per MLP layer in a residual chain over {LAYERS} distinct layers ({} rounds per evaluation; MLX bf16: the faster of its two residual adds, marked a (matmul, add) or m (addmm)), median (best) of {} evaluations, µs; {}",
        if args.down_axis == 1 { ", down projections coded on axis 1" } else { "" },
        args.rounds,
        args.evals,
        graphs::note()
    );
    let per_width = |k| vec![format!("trellis k{k}"), "vs bf16".into(), "vs affine 4-bit".into()];
    println!("{}", table_head(&["M", "MLX bf16", "MLX affine 4-bit"], &args.bits, per_width));
    for &m in &args.rows {
        let (Some(bf), Some(q4)) = (get(m, "MLX bf16"), get(m, "MLX affine 4-bit")) else { continue };
        let how = if get(m, Bf16Residual::Addmm.name()).is_some_and(|a| a.median == bf.median) { "m" } else { "a" };
        let mut line = format!("| {m} | {:.1} ({:.1}) {how} | {:.1} ({:.1}) |", bf.median, bf.best, q4.median, q4.best);
        for k in &args.bits {
            if let Some(t) = get(m, &format!("trellis k{k}")) {
                let _ = write!(
                    line,
                    " {:.1} ({:.1}) | {:.2}x | {:.2}x |",
                    t.median,
                    t.best,
                    bf.median / t.median,
                    q4.median / t.median
                );
            }
        }
        println!("{line}");
    }
    let k = args.bits[0];
    if args.ws_down {
        let title = format!("The k{k} chain with the down projection on the warp-specialized GEMM (not planned)");
        let variants = ["ws down, 1 team", "ws down, 3 teams"].map(|v| (v.to_string(), format!("trellis {v}")));
        variant_table(args, rows, &title, &variants);
    }
    if !args.ws_stages.is_empty() {
        let title = format!(
            "The k{k} chain with gate·up on the warp-specialized GEMM at other ring depths (the plan's: {})",
            plan_ws_stages()
        );
        let variants: Vec<_> =
            args.ws_stages.iter().map(|s| (format!("{s} stages"), format!("trellis ws, {s} stages"))).collect();
        variant_table(args, rows, &title, &variants);
    }
    if args.int8 {
        let title = format!("The k{k} chain with gate·up on the int8 kernel (not planned) and on the plan, both unfed");
        let variants =
            ["gate·up planned, unfed", "gate·up int8, unfed"].map(|v| (v.to_string(), format!("trellis {v}")));
        variant_table(args, rows, &title, &variants);
    }
    if args.alone {
        println!("\nEach projection alone, independent calls over the {LAYERS} layers in turn (cold in L2), per call, median µs");
        let names: Vec<&str> = rows.iter().filter(|r| r.name.ends_with("alone")).map(|r| r.name.as_str()).collect();
        let mut names: Vec<&str> = names.into_iter().fold(Vec::new(), |mut v, n| {
            if !v.contains(&n) {
                v.push(n);
            }
            v
        });
        names.sort();
        println!("| M | {} |\n|---|{}", names.join(" | "), "---|".repeat(names.len()));
        for &m in &args.rows {
            let cells: Vec<String> =
                names.iter().map(|n| get(m, n).map_or("-".into(), |r| format!("{:.1}", r.median))).collect();
            println!("| {m} | {} |", cells.join(" | "));
        }
    }
    if args.pipelined {
        pipelined_table(args, rows);
    }
    // The host's part of each chain: where it is close to the chain's time, the GPU waits for it.
    println!("\nThe host's part of an evaluation (MLX's async_eval, which records and launches the chain and returns without waiting), µs per MLP layer, median");
    println!("{}", table_head(&["M", "MLX bf16 (matmul, add)"], &args.bits, |k| vec![format!("trellis k{k}")]));
    for &m in &args.rows {
        let cell = |name: &str| get(m, name).map_or("-".to_string(), |r| format!("{:.1}", r.median));
        let mut line = format!("| {m} | {} |", cell("MLX bf16 (matmul, add) host"));
        for k in &args.bits {
            let _ = write!(line, " {} |", cell(&format!("trellis k{k} host")));
        }
        println!("{line}");
    }
    println!("\nFirst layer against the f64 reference (relErr = max|a-b| / max|b|)\n| bits | M | relErr | |\n|---|---|---|---|\n{checks}");
    if let Some(path) = &args.json {
        let body: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "  {{\"m\": {}, \"name\": \"{}\", \"median_us\": {:.2}, \"best_us\": {:.2}}}",
                    r.m, r.name, r.median, r.best
                )
            })
            .collect();
        std::fs::write(path, format!("[\n{}\n]\n", body.join(",\n")))?;
    }
    Ok(())
}

/// The SVG plot of a `--json` table: time per MLP layer against the row count, one line per
/// contender (log-log).
mod plot_json {
    use anyhow::{Context, Result};

    pub fn write(json: &str, svg: &str) -> Result<()> {
        let text = std::fs::read_to_string(json).with_context(|| format!("reading {json}"))?;
        let rows: Vec<serde_json::Value> = serde_json::from_str(&text).with_context(|| format!("parsing {json}"))?;
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for r in &rows {
            let name = r["name"].as_str().context("name")?.to_string();
            // Each projection alone, the host's parts, the pipelined chains, and MLX bf16's two
            // residual adds (its line is the faster).
            if name.ends_with("alone")
                || name.ends_with("host")
                || name.ends_with("pipelined")
                || name.starts_with("MLX bf16 (")
            {
                continue;
            }
            let point = (r["m"].as_f64().context("m")?, r["median_us"].as_f64().context("median_us")?);
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(point),
                None => series.push((name, vec![point])),
            }
        }
        super::plot::lines(
            &series,
            std::path::Path::new(svg),
            &super::plot::Chart {
                caption: "Qwen3-14B MLP per layer, chain of distinct layers, H200 (µs)",
                x_desc: "activation rows M",
                y_desc: "µs per MLP layer",
                x_log: true,
                y_log: true,
            },
        )
    }
}
