//! The examples' line plots (SVG through `plotters`): one line with points per series, a legend,
//! each axis linear or logarithmic, its range fitted to the points.
#![allow(dead_code)] // each example uses a subset

use std::path::Path;

use anyhow::{bail, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// Points `(x, y)` of one named line.
pub type Series = (String, Vec<(f64, f64)>);

/// What a plot says around its lines.
pub struct Chart<'a> {
    /// The title.
    pub caption: &'a str,
    /// The x axis' label.
    pub x_desc: &'a str,
    /// The y axis' label.
    pub y_desc: &'a str,
    /// Whether the x axis is logarithmic (its points must then be positive).
    pub x_log: bool,
    /// Whether the y axis is logarithmic (its points must then be positive).
    pub y_log: bool,
}

/// The range an axis shows for values in `lo..=hi`: a margin of 20 % either side on a log
/// axis, of 5 % of the span (at least 0.25) on a linear one.
fn span(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        (lo * 0.8, hi * 1.25)
    } else {
        let pad = ((hi - lo) * 0.05).max(0.25);
        (lo - pad, hi + pad)
    }
}

/// Draws `series` into the SVG file `path`.
pub fn lines(series: &[Series], path: &Path, chart: &Chart) -> Result<()> {
    let points = || series.iter().flat_map(|(_, v)| v.iter().copied());
    if points().next().is_none() {
        bail!("nothing to plot");
    }
    if points().any(|(x, y)| !x.is_finite() || !y.is_finite() || (chart.x_log && x <= 0.0) || (chart.y_log && y <= 0.0))
    {
        bail!("a point to plot is not finite, or not positive on a logarithmic axis");
    }
    let (x_lo, x_hi) = points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y_lo, y_hi) = points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (x0, x1) = span(x_lo, x_hi, chart.x_log);
    let (y0, y1) = span(y_lo, y_hi, chart.y_log);
    match (chart.x_log, chart.y_log) {
        (false, false) => draw(series, path, chart, x0..x1, y0..y1),
        (true, false) => draw(series, path, chart, (x0..x1).log_scale(), y0..y1),
        (false, true) => draw(series, path, chart, x0..x1, (y0..y1).log_scale()),
        (true, true) => draw(series, path, chart, (x0..x1).log_scale(), (y0..y1).log_scale()),
    }
}

fn draw<X, Y>(series: &[Series], path: &Path, chart: &Chart, x: X, y: Y) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?;
    c.configure_mesh().x_desc(chart.x_desc).y_desc(chart.y_desc).draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).mix(0.9);
        c.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        c.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    c.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.9)).draw()?;
    root.present()?;
    Ok(())
}
