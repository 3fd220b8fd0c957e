//! How an evaluation is timed: synchronously (the headline), pipelined as a decode loop runs its
//! tokens, and the host's part alone.

use std::time::Instant;

use anyhow::Result;
use mlx_trellis::{async_eval_all, eval_all, MlxArray};

/// Median and best microseconds per step of `steps` built by `f` (one evaluation each).
pub(crate) fn time(
    evals: usize,
    steps: usize,
    f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>,
) -> Result<(f64, f64)> {
    let run = || -> Result<f64> {
        let outs = f()?;
        let t = Instant::now();
        eval_all(&outs.iter().collect::<Vec<_>>())?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / steps as f64)
    };
    run()?; // warm-up: kernel compilation, caches, allocator
    let v = (0..evals).map(|_| run()).collect::<Result<Vec<_>>>()?;
    Ok(median_best(v))
}

/// Microseconds per step of `evals` evaluations of `steps` built by `f`, evaluated as a decode
/// loop evaluates its tokens: each evaluation is built and started (`async_eval`) before the one
/// before it is waited for, so the host's work on the next overlaps the GPU's on this one (the
/// GPU runs them in order on one stream). An evaluation's time is the time between its end and
/// the end of the one before it.
pub(crate) struct Pipelined {
    /// The median of those times.
    pub median: f64,
    /// The least of them. Not a rate: an end the host observes late shortens the next time.
    pub best: f64,
    /// The steady-state rate: their mean, the time from the first end to the last over the
    /// evaluations between, which no late observation of one end moves.
    pub mean: f64,
}

/// Times `evals` pipelined evaluations of `steps` built by `f`; see [`Pipelined`].
pub(crate) fn time_pipelined(
    evals: usize,
    steps: usize,
    f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>,
) -> Result<Pipelined> {
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
    // The times between consecutive ends add up to the first end's distance from the last.
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let (median, best) = median_best(v);
    Ok(Pipelined { median, best, mean })
}

/// The median and the best (least) of `v`'s timings.
fn median_best(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// Median microseconds per step of the host's part of an evaluation of `steps` built by `f`: how
/// long MLX's `async_eval` takes to record and launch it (it returns without waiting for the
/// GPU), each evaluation then waited for before the next. Where it is close to [`time`]'s
/// figure, the chain waits for the host, not for the GPU.
pub(crate) fn host_time(evals: usize, steps: usize, f: &dyn Fn() -> mlx_trellis::Result<Vec<MlxArray>>) -> Result<f64> {
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
    let v = (0..evals).map(|_| run()).collect::<Result<Vec<_>>>()?;
    Ok(median_best(v).0)
}
