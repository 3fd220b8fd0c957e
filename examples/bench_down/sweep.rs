//! `--sweep`: the kernels' configurations around each plan, timed alone at each row count (the
//! down kernel's, and with `--axis-one` the axis-1 kernels'), or those `--configs` names.

use std::fmt::Write as _;

use anyhow::Result;
use mlx_trellis::trellis::cuda::gate_up;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, axis_one_with, down_cuda_partials, down_cuda_with, plan_for, split_pass_tiles, swiglu_with,
    AxisOneConfig, AxisOneKernel, CudaDownConfig, StepUnroll, INT8_MAX_ROWS,
};
use mlx_trellis::trellis::{TrellisGeometry, TrellisLinear};
use mlx_trellis::Dtype;

use crate::{checked_run, time, Args, Case, Report};

/// Every configuration worth trying at `m` rows, timed and checked against the reference `want`.
pub(crate) fn sweep(c: Case, args: &Args, report: &mut Report) -> Result<()> {
    let Case { layer, x, m, .. } = c;
    let g = *layer.lin.geometry();
    let configs = if let Some(given) = &args.configs {
        std::iter::once(plan_for(&g, m, x.dtype())).chain(given.iter().copied()).collect()
    } else {
        fragment_configs(&g, x.dtype(), m)
    };
    time_configs(c, args, report, configs)
}

/// The axis-1 kernel's plan and its shapes around it at `m` rows (every row tile count and warp
/// count of the plan's pass, and the int8 kernel's), timed and checked against the reference
/// `want`: one projection, or with `up` the fused gate·up·SwiGLU (`layer` as gate).
pub(crate) fn sweep_axis_one(c: Case, up: Option<&TrellisLinear>, args: &Args, report: &mut Report) -> Result<()> {
    let Case { layer, x, m, want } = c;
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

/// The kernel's configurations worth trying at `m` rows.
pub(crate) fn fragment_configs(g: &TrellisGeometry, dtype: Dtype, m: usize) -> Vec<CudaDownConfig> {
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
pub(crate) fn time_configs(c: Case, args: &Args, report: &mut Report, configs: Vec<CudaDownConfig>) -> Result<()> {
    let Case { layer, x, m, want } = c;
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
        eprintln!("[sweep] {} M={m} {cfg}: {med:.1} us", layer.name);
    }
    Ok(())
}
