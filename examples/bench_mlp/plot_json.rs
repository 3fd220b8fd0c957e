//! The SVG plot of a `--json` table: time per MLP layer against the row count, one line per
//! contender (log-log).

use anyhow::{Context, Result};

/// Draws the table in `json` (written by `--json`) as the SVG plot `svg`.
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
    crate::plot::lines(
        &series,
        std::path::Path::new(svg),
        &crate::plot::Chart {
            caption: "Qwen3-14B MLP per layer, chain of distinct layers, H200 (µs)",
            x_desc: "activation rows M",
            y_desc: "µs per MLP layer",
            x_log: true,
            y_log: true,
        },
    )
}
