//! An SVG plot of a phase: throughput per second, and p50/p99 latency per second.

use crate::stats::Summary;
use plotters::prelude::*;
use std::path::Path;

pub fn plot(summary: &Summary, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(360);
    let seconds = summary.timeline.len().max(1) as f64;
    let max_ops = summary
        .timeline
        .iter()
        .map(|p| p.operations)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut throughput = ChartBuilder::on(&top)
        .caption(
            format!("{} {}: throughput (ops/s)", summary.workload, summary.phase),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max_ops * 1.1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    throughput
        .configure_mesh()
        .x_desc("second")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    throughput
        .draw_series(LineSeries::new(
            summary
                .timeline
                .iter()
                .map(|p| (p.second as f64, p.operations as f64)),
            &BLUE,
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let max_latency = summary
        .timeline
        .iter()
        .map(|p| p.p99_ms)
        .fold(0.001, f64::max);
    let mut latency = ChartBuilder::on(&bottom)
        .caption("latency (ms): p50 blue, p99 red", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max_latency * 1.1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    latency
        .configure_mesh()
        .x_desc("second")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    latency
        .draw_series(LineSeries::new(
            summary.timeline.iter().map(|p| (p.second as f64, p.p50_ms)),
            &BLUE,
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    latency
        .draw_series(LineSeries::new(
            summary.timeline.iter().map(|p| (p.second as f64, p.p99_ms)),
            &RED,
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
