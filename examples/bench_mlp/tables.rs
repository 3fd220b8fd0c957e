//! The benchmark's tables, printed from its timed rows, and its JSON.

use std::fmt::Write as _;

use anyhow::Result;
use mlx_trellis::trellis::cuda::tuning::axis_one_plan;
use mlx_trellis::Dtype;

use crate::dense::Bf16Residual;
use crate::variants::down_config_column;
use crate::{graphs, Args, Row, HIDDEN, INTER, LAYERS};

/// The timed row of `m` activation rows named `name`, if that contender ran.
pub(crate) fn row_of<'a>(rows: &'a [Row], m: usize, name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.m == m && r.name == name)
}

/// The ring depth the plan gives the warp-specialized GEMM (at 128 rows, fused).
pub(crate) fn plan_ws_stages() -> u32 {
    axis_one_plan(128, Dtype::Bfloat16, true, INTER).stages
}

/// The `k`-bit chain against its `variants` (each a column header and the row name it was timed
/// under), µs per MLP layer, median (best), and the planned path's time over each; row counts
/// where no variant ran are left out.
pub(crate) fn variant_table(args: &Args, rows: &[Row], k: u32, title: &str, variants: &[(String, String)]) {
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
        let Some(planned) = get(m, &format!("trellis k{k}")) else { continue };
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
pub(crate) fn table_head(lead: &[&str], bits: &[u32], per_width: impl Fn(u32) -> Vec<String>) -> String {
    let columns: Vec<String> =
        lead.iter().map(|c| c.to_string()).chain(bits.iter().flat_map(|&k| per_width(k))).collect();
    format!("| {} |\n|{}", columns.join(" | "), "---|".repeat(columns.len()))
}

/// The chains with pipelined evaluations (`--pipelined`) beside the headline's synchronous ones:
/// each chain's median time between two evaluations' ends and, in brackets, its steady-state
/// rate (first end to last over the evaluations between; the least time between two ends is no
/// rate, an end observed late shortens the next).
pub(crate) fn pipelined_table(args: &Args, rows: &[Row]) {
    let get = |m: usize, name: &str| row_of(rows, m, name);
    println!(
        "\nPipelined evaluations (each started before the one before it is waited for, as a decode loop runs its tokens; MLX bf16 with matmul then add), µs per MLP layer, median (mean over the run), the synchronous evaluation's median, and the ratio of medians (of means)"
    );
    let lead = ["M", "MLX bf16", "sync", "MLX affine 4-bit", "sync"];
    println!("{}", table_head(&lead, &args.bits, |k| vec![format!("trellis k{k}"), "sync".into(), "vs bf16".into()]));
    let mean = |m: usize, name: &str| get(m, &format!("{name} mean")).map(|r| r.median);
    let cell = |m: usize, name: &str| match (get(m, name), mean(m, name)) {
        (Some(r), Some(a)) => format!("{:.1} ({a:.1})", r.median),
        (Some(r), None) => format!("{:.1}", r.median),
        _ => "-".to_string(),
    };
    let median = |r: Option<&Row>| r.map_or("-".to_string(), |r| format!("{:.1}", r.median));
    for &m in &args.rows {
        let Some(bf) = get(m, "MLX bf16 pipelined") else { continue };
        let mut line = format!(
            "| {m} | {} | {} | {} | {} |",
            cell(m, "MLX bf16 pipelined"),
            median(get(m, Bf16Residual::Add.name())),
            cell(m, "MLX affine 4-bit pipelined"),
            median(get(m, "MLX affine 4-bit"))
        );
        for k in &args.bits {
            let name = format!("trellis k{k} pipelined");
            let ratio = match (get(m, &name), mean(m, "MLX bf16 pipelined"), mean(m, &name)) {
                (Some(t), Some(bm), Some(tm)) => format!("{:.2}x ({:.2}x)", bf.median / t.median, bm / tm),
                (Some(t), _, _) => format!("{:.2}x", bf.median / t.median),
                _ => "-".to_string(),
            };
            let _ = write!(line, " {} | {} | {ratio} |", cell(m, &name), median(get(m, &format!("trellis k{k}"))));
        }
        println!("{line}");
    }
}

pub(crate) fn print_tables(args: &Args, rows: &[Row], checks: &str) -> Result<()> {
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
        variant_table(args, rows, k, &title, &variants);
    }
    if !args.ws_stages.is_empty() {
        let title = format!(
            "The k{k} chain with gate·up on the warp-specialized GEMM at other ring depths (the plan's: {})",
            plan_ws_stages()
        );
        let variants: Vec<_> =
            args.ws_stages.iter().map(|s| (format!("{s} stages"), format!("trellis ws, {s} stages"))).collect();
        variant_table(args, rows, k, &title, &variants);
    }
    if args.int8 {
        let title = format!("The k{k} chain with gate·up on the int8 kernel (not planned) and on the plan, both unfed");
        let variants =
            ["gate·up planned, unfed", "gate·up int8, unfed"].map(|v| (v.to_string(), format!("trellis {v}")));
        variant_table(args, rows, k, &title, &variants);
    }
    // --down-configs: each width's chain with its down projection on each configuration, and on
    // the plan's called the same way (unfed).
    if !args.down_configs.is_empty() {
        let columns: Vec<String> =
            std::iter::once(None).chain(args.down_configs.iter().map(Some)).map(down_config_column).collect();
        for &k in &args.bits {
            let title = format!("The k{k} chain with the down projection on explicit configurations");
            let variants: Vec<_> = columns.iter().map(|c| (c.clone(), format!("trellis k{k} down {c}"))).collect();
            variant_table(args, rows, k, &title, &variants);
        }
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
