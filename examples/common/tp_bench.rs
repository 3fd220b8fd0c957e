//! `bench_mlp --tp N`: the MLP benchmark's residual chain of distinct layers with every layer
//! split over N processes (one all-reduce per layer), started on this machine by the launcher
//! of `mlx_trellis::distributed::launcher` (`--backend any|ring|nccl`; any: NCCL on MLX's CUDA build when it has it).
//!
//! Each rank builds the same seeded layers as `bench_mlp`, keeps its shard of each, and times
//! per evaluation: the sharded chain `x <- x + all_sum(mlp_shard_l(x))`, its local part alone
//! (no all-reduce), and a chain of as many all-reduces alone on `[M, hidden]` bf16 arrays. Rank 0
//! also keeps the whole layers and times the unsharded chain in the same evaluations (the two
//! alternate, so drift hits both alike), checks the sharded layer 0 against the unsharded one at
//! every row count, and prints the table. With one rank MLX elides the all-reduce (a group of one
//! returns its input), so `--tp 1` measures what the sharded path adds around the same kernels.
//!
//! `bench_mlp --help` lists the options (`--tp`, `--backend`, `--layers`, `--hidden`, `--inter`,
//! `--timeout` besides the benchmark's own).

use std::fmt::Write as _;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_trellis::distributed::launcher as tp;
use mlx_trellis::distributed::{bf16_tp_gate, CollectiveBackend, Group, ShardedMlp};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::ForwardPath;
use mlx_trellis::{backend, eval_all, Dtype, MlxArray};

use super::{chain, seeded_mlp, to_f64};

/// `bench_mlp`'s tensor-parallel options.
#[derive(clap::Args)]
pub struct TpArgs {
    /// Split every layer over N processes of this program on this machine (tensor parallelism)
    #[arg(long, value_name = "N", value_parser = super::cli::positive)]
    pub tp: Option<usize>,
    /// With --tp: the distributed back-end, any (NCCL on MLX's CUDA build when it has it, else
    /// the ring over 127.0.0.1), ring or nccl
    #[arg(long, value_name = "BACKEND", default_value = "any", requires = "tp")]
    pub backend: CollectiveBackend,
    /// With --tp: distinct layers in the chain
    #[arg(long, value_name = "L", value_parser = super::cli::positive, default_value_t = 8, requires = "tp")]
    pub layers: usize,
    /// With --tp: hidden width of the layers
    #[arg(long, value_name = "H", default_value_t = 5120, requires = "tp")]
    pub hidden: usize,
    /// With --tp: intermediate width of the layers
    #[arg(long, value_name = "I", default_value_t = 17408, requires = "tp")]
    pub inter: usize,
    /// With --tp: the launch's watchdog, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 540, requires = "tp")]
    pub timeout: u64,
}

struct Args {
    tp: usize,
    backend: CollectiveBackend,
    rows: Vec<usize>,
    bits: u32,
    rounds: usize,
    evals: usize,
    layers: usize,
    hidden: usize,
    inter: usize,
    timeout: u64,
}

fn parse(c: &super::Cli) -> Result<Args> {
    let bits = match c.bits.as_deref() {
        None => 3,
        Some(&[k]) => k,
        Some(_) => bail!("--bits takes one width with --tp"),
    };
    let t = &c.tp;
    Ok(Args {
        tp: t.tp.unwrap_or(1),
        backend: t.backend,
        rows: c.rows.rows.clone(),
        bits,
        rounds: c.rounds,
        evals: c.evals,
        layers: t.layers,
        hidden: t.hidden,
        inter: t.inter,
        timeout: t.timeout,
    })
}

/// The benchmark: the launch from the parent, or one rank's part in a launched process.
pub fn run(cli: &super::Cli) -> Result<()> {
    let a = parse(cli)?;
    if let Some(joined) = tp::rank_group() {
        let (group, _) = joined?;
        return rank(&a, Rc::new(group));
    }
    eprintln!("[bench tp] MLX back-end {}; starting {} rank(s)", backend(), a.tp);
    let launch = tp::Launch::new(a.tp, a.backend, Duration::from_secs(a.timeout));
    let exe = std::env::current_exe()?;
    let report = tp::run(&launch, &|_| {
        let mut c = Command::new(&exe);
        c.args(std::env::args().skip(1));
        c
    })?;
    print!("{}", report.ranks[0].stdout);
    report.check()?;
    eprintln!("[bench tp] {} rank(s) over {} in {:.1} s", a.tp, report.backend, report.elapsed.as_secs_f64());
    Ok(())
}

/// Median and best microseconds per step for each of `runs`, evaluated in turn once per
/// evaluation (after one warm-up round); `None` entries are skipped on this rank.
fn time_alternating(
    evals: usize,
    steps: usize,
    runs: &[Option<&dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>>],
) -> Result<Vec<(f64, f64)>> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for e in 0..=evals {
        for (i, f) in runs.iter().enumerate() {
            let Some(f) = f else { continue };
            let outs = f()?;
            let t = Instant::now();
            eval_all(&outs.iter().collect::<Vec<_>>())?;
            if e > 0 {
                samples[i].push(t.elapsed().as_secs_f64() * 1e6 / steps as f64);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            if v.is_empty() {
                (f64::NAN, f64::NAN)
            } else {
                (v[v.len() / 2], v[0])
            }
        })
        .collect())
}

fn rank(a: &Args, group: Rc<Group>) -> Result<()> {
    let (r, n) = (group.rank(), group.size());
    let lead = r == 0;
    let k = a.bits;
    let t = Instant::now();
    let mut whole = Vec::new();
    let mut shards = Vec::new();
    for l in 0..a.layers {
        // Down projections on axis 0 (the orientation the shards split).
        let (mlp, _) = seeded_mlp(l, k, a.hidden, a.inter, 0)?;
        shards.push(ShardedMlp::from_full(&mlp, group.clone())?);
        if lead {
            whole.push(mlp);
        }
    }
    eprintln!(
        "[bench tp] rank {r} of {n}: built {} k{k} layers and kept its shards in {:.1} s",
        a.layers,
        t.elapsed().as_secs_f64()
    );
    let max_m = *a.rows.iter().max().context("no rows")?;
    let x_all = MlxArray::from_slice(&gaussian(max_m * a.hidden, 99)?, &[max_m, a.hidden])?.astype(Dtype::Bfloat16)?;
    x_all.eval()?;
    let steps = a.rounds * a.layers;
    let mut table = String::new();
    let mut worst: f64 = 0.0;
    for &m in &a.rows {
        let x = x_all.slice(&[0, 0], &[m as i32, a.hidden as i32], &[1, 1])?.contiguous()?;
        x.eval()?;
        let ys = shards[0].forward(&x, ForwardPath::Auto)?;
        ys.eval()?;
        let err = if lead { rel_err(&to_f64(&ys)?, &to_f64(&whole[0].forward(&x)?)?)? } else { 0.0 };
        worst = worst.max(err);
        // Every chain adds the residual by MLX's add, as the sharded layer must after its
        // all-reduce, so that the rows differ by the sharding alone.
        let unsharded = || chain(&whole, a.rounds, &x, &|l, x| x.add(&l.forward(x)?));
        let sharded = || chain(&shards, a.rounds, &x, &|l, x| x.add(&l.forward(x, ForwardPath::Auto)?));
        let local = || chain(&shards, a.rounds, &x, &|l, x| x.add(&l.forward_local(x, ForwardPath::Auto)?));
        let reduce = || -> mlx_trellis::Result<Vec<MlxArray>> {
            let mut y = x.clone();
            for _ in 0..steps {
                y = y.all_sum(&group)?;
            }
            Ok(vec![y])
        };
        let runs: [Option<&dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>>; 4] =
            [lead.then_some(&unsharded as _), Some(&sharded), Some(&local), Some(&reduce)];
        let t = time_alternating(a.evals, steps, &runs)?;
        if lead {
            eprintln!(
                "[bench tp] M = {m}: TP {n} {:.1} us per layer (unsharded {:.1}), relErr {err:.1e}",
                t[1].0, t[0].0
            );
        }
        let _ = writeln!(
            table,
            "| {m} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.3} | {:.1} | {:.1} | {err:.1e} |",
            t[0].0,
            t[0].1,
            t[1].0,
            t[1].1,
            t[1].0 / t[0].0,
            t[2].0,
            t[3].0
        );
    }
    if lead {
        println!(
            "Qwen MLP {} -> {} -> {}, k{k}, bf16 activations, per MLP layer in a residual chain over {} distinct layers ({} rounds per evaluation), median (best) of {} evaluations, µs; TP {n} over {:?}, MLX back-end {}",
            a.hidden, a.inter, a.hidden, a.layers, a.rounds, a.evals, *group, backend()
        );
        println!("| M | unsharded | TP {n} (shard + all-reduce) | TP / unsharded | local shard alone | all-reduce alone | relErr TP vs unsharded (layer 0) |");
        println!("|---|---|---|---|---|---|---|\n{table}");
        if n == 1 {
            println!("With one rank MLX returns an all-reduce's input: the TP column is the sharded path around the same kernels.");
        }
        let gate = bf16_tp_gate(n);
        if worst >= gate {
            let miss = format!(
                "the sharded layer 0 missed its bf16 gate {gate:.1e} against the unsharded one: relErr {worst:.3e}"
            );
            return Err(super::exit::GateMissed(miss).into());
        }
    }
    Ok(())
}
