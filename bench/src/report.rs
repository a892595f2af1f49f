//! An SVG plot of a phase: throughput per second, and p50/p99 latency per second.

use crate::stats::Summary;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the plot: {error}")
}

/// Draws `lines` (points and colour) on `area` over `seconds` with y from 0 to `max_y`.
fn line_chart(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    seconds: f64,
    max_y: f64,
    lines: Vec<(Vec<(f64, f64)>, RGBColor)>,
) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max_y * 1.1)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("second")
        .draw()
        .map_err(plot_error)?;
    for (points, colour) in lines {
        chart
            .draw_series(LineSeries::new(points, &colour))
            .map_err(plot_error)?;
    }
    Ok(())
}

pub fn plot(summary: &Summary, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (top, bottom) = root.split_vertically(360);
    let seconds = summary.timeline.len().max(1) as f64;
    let series = |value: fn(&crate::stats::TimelinePoint) -> f64| -> Vec<(f64, f64)> {
        summary
            .timeline
            .iter()
            .map(|p| (p.second as f64, value(p)))
            .collect()
    };
    let max_ops = summary
        .timeline
        .iter()
        .map(|p| p.operations)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    line_chart(
        &top,
        &format!("{} {}: throughput (ops/s)", summary.workload, summary.phase),
        seconds,
        max_ops,
        vec![(series(|p| p.operations as f64), BLUE)],
    )?;
    let max_latency = summary
        .timeline
        .iter()
        .map(|p| p.p99_ms)
        .fold(0.001, f64::max);
    line_chart(
        &bottom,
        "latency (ms): p50 blue, p99 red",
        seconds,
        max_latency,
        vec![(series(|p| p.p50_ms), BLUE), (series(|p| p.p99_ms), RED)],
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}
