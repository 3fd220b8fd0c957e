//! The diagnostic modes: `--paths` (the fused kernel against the dense path, and the decode
//! alone), `--probe` (where one queued call's time goes) and `--folds` (MLX's fold of split-K
//! partials in candidate layouts).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Context, Result};
use mlx_trellis::trellis::cuda::down::down_pair_cuda;
use mlx_trellis::trellis::cuda::expand::{down_cuda_dense, expand_cuda};
use mlx_trellis::trellis::cuda::tuning::{down_cuda_partials, down_cuda_with, plan, CudaDownConfig};
use mlx_trellis::trellis::cuda::FoldCounters;
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::{synthetic_layer, ForwardPath, TrellisLinear};
use mlx_trellis::{Dtype, MlxArray};

use crate::check::to_f64;
use crate::{time, time_each, Args, Case, Report};

/// The fused kernel (its plan) against the dense path (decode, then MLX's matmul) at `m` rows,
/// and the decode alone: where the planned dispatch should switch.
pub(crate) fn paths(c: Case, args: &Args, report: &mut Report) -> Result<()> {
    let Case { layer, x, m, want } = c;
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

/// Where the time of one call goes: the kernel alone, MLX's fold, a trivial custom kernel. The
/// fed calls' outputs of the layer are checked against the f64 reference.
pub(crate) fn probe(c: Case, args: &Args, report: &mut Report) -> Result<()> {
    let Case { layer, x, m, want } = c;
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
    // The same pair run fed (as a decoding model runs it: no pre-pass, the blocks find the rows'
    // powers of two, the fold counters from a fill): a fill per call, and one fill for all the
    // calls of an evaluation (a model's pass has one). Their outputs against the pair call's.
    if let Some(n) = TrellisLinear::fed_counters(&[&layer.lin, &partner], m, x.dtype()) {
        let fed =
            |counters: &mut FoldCounters| TrellisLinear::forward_shared_input_fed(&[&layer.lin, &partner], x, counters);
        let own_fill = || -> mlx_trellis::Result<Vec<MlxArray>> { fed(&mut FoldCounters::zeroed(n)?) };
        let ys = own_fill()?;
        let err = rel_err(&to_f64(&ys[0])?, want)?;
        report.check(&ys[0], err, || format!("{} M={m} fed pair", layer.name))?;
        // Each output against the pre-passed pair call's (the partner has no f64 reference here);
        // a non-finite or distant one fails the run as a failed reference check does.
        for (i, (y, w)) in ys.iter().zip(&pair()?).enumerate() {
            let err = rel_err(&to_f64(y)?, &to_f64(w)?)?;
            println!("probe fed pair {} M={m}: relErr {err:.1e} against the pre-passed pair call", layer.name);
            report.check(y, err, || {
                format!("{} M={m} fed pair, matrix {i} against the pre-passed pair call", layer.name)
            })?;
        }
        let fed_queued = time_each(args.calls, args.evals, &own_fill)?;
        // One fill for all the calls of an evaluation: one timed "call" that queues them all.
        let total = n.checked_mul(args.calls).context("fold counters for --calls overflow")?;
        let one_fill = || -> mlx_trellis::Result<Vec<MlxArray>> {
            let mut counters = FoldCounters::zeroed(total)?;
            Ok((0..args.calls).map(|_| fed(&mut counters)).collect::<mlx_trellis::Result<Vec<_>>>()?.concat())
        };
        let one_fill_per_call = time_each(1, args.evals, &one_fill)?.0 / args.calls as f64;
        println!(
            "probe fed pair {} M={m}: a fill a call {:.1} us, one fill for {} calls {:.1} us a call (queued; the pre-passed pair call {:.1})",
            layer.name, fed_queued.0, args.calls, one_fill_per_call, pair_queued.0
        );
    }
    if let Some(n) = TrellisLinear::fed_counters(&[&layer.lin], m, x.dtype()) {
        let single = || -> mlx_trellis::Result<Vec<MlxArray>> {
            TrellisLinear::forward_shared_input_fed(&[&layer.lin], x, &mut FoldCounters::zeroed(n)?)
        };
        let y = single()?.remove(0);
        let err = rel_err(&to_f64(&y)?, want)?;
        report.check(&y, err, || format!("{} M={m} fed call", layer.name))?;
        let fed_queued = time_each(args.calls, args.evals, &single)?;
        println!(
            "probe fed call {} M={m}: {:.1} us a call with its fill (queued; the pre-passed call {:.1})",
            layer.name, fed_queued.0, full.0
        );
    }
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
pub(crate) fn folds(args: &Args) -> Result<()> {
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
