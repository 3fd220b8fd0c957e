//! The chains with a kernel the plan does not take (the A/B runs behind the plan's choices).

use anyhow::Result;
use mlx_trellis::trellis::cuda::down::uses_dense;
use mlx_trellis::trellis::cuda::tuning::{
    axis_one_plan, down_residual_cuda_with, down_ws_cuda_with, plan_for, swiglu_with, AxisOneConfig, AxisOneKernel,
    CudaDownConfig, CudaDownWsConfig, INT8_MAX_ROWS,
};
use mlx_trellis::trellis::TrellisMlp;
use mlx_trellis::{Dtype, MlxArray};

use crate::timing::time;
use crate::{alone, chain_variant, ChainCase, Row, HIDDEN, INTER, LAYERS};

/// The first bit width's chain with each layer's down projection (and the residual add) on the
/// warp-specialized GEMM (`down_ws.cu`), one and three producer teams: the first layer against
/// the f64 reference (`want_residual`), then the chain, and with `args.alone` the down
/// projection alone.
pub(crate) fn ws_down_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
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

/// The column of the down projection on `cfg` (`--down-configs`), or on the plan's own
/// configuration called the same way where `cfg` is `None`; the row of the `k`-bit chain is
/// `trellis k{k} down {column}`.
pub(crate) fn down_config_column(cfg: Option<&CudaDownConfig>) -> String {
    cfg.map_or_else(|| "planned, unfed".to_string(), |cfg| cfg.to_string())
}

/// `--down-configs`: the `k`-bit chain with each layer's down projection (and the residual add)
/// on each given configuration, after the planned gate·up·SwiGLU called on its own (so the down
/// call prepares its own counters, and its pre-pass where the configuration has one), beside the
/// plan's configuration called the same way (where the plan takes the kernel, not the dense
/// path): the first layer against the f64 reference, then the chain. A configuration that does
/// not fit the layer's geometry is skipped, saying why.
pub(crate) fn down_config_rows(c: &ChainCase, k: u32, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
    let ChainCase { layers, m, args, .. } = *c;
    let auto = mlx_trellis::trellis::ForwardPath::Auto;
    let g = *layers[0].down().geometry();
    let planned = (!uses_dense(m, Dtype::Bfloat16)).then(|| plan_for(&g, m, Dtype::Bfloat16));
    let given = args.down_configs.iter().map(|cfg| (*cfg, down_config_column(Some(cfg))));
    for (cfg, column) in planned.map(|cfg| (cfg, down_config_column(None))).into_iter().chain(given) {
        if let Err(e) = cfg.check(&g, Dtype::Bfloat16) {
            eprintln!("[bench] --down-configs: {cfg} does not fit the k{k} down projection: {e}");
            continue;
        }
        let step = |l: &TrellisMlp, x: &MlxArray| {
            let d = l.down();
            down_residual_cuda_with(&l.swiglu_with(x, auto)?, d.codes(), d.scales(), d.geometry(), cfg, x)
        };
        chain_variant(c, &format!("k{k} down {column}"), &step, rows, checks)?;
    }
    Ok(())
}

/// The first bit width's chain with the fused gate·up·SwiGLU on the warp-specialized GEMM at
/// each of `args.ws_stages` ring depths (the plan's configuration otherwise), where the plan
/// takes that GEMM: the first layer against the f64 reference, then the chain.
pub(crate) fn ws_stages_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
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
pub(crate) fn int8_serves(m: usize) -> bool {
    m <= INT8_MAX_ROWS && AxisOneConfig::plain(AxisOneKernel::Int8).int8_shared_bytes(m, HIDDEN, true).is_some()
}

/// --int8: the chain with the fused gate·up·SwiGLU on the int8 kernel and, for a like-for-like
/// comparison, on the planned kernel through the same call (neither hands the down kernel its
/// counters, so the down projection's own launch prepares them), where the int8 kernel serves
/// the rows.
pub(crate) fn int8_rows(c: &ChainCase, rows: &mut Vec<Row>, checks: &mut String) -> Result<()> {
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
