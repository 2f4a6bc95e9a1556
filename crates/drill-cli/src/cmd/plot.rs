//! `drill plot`: evaluation return against env steps, one line per experiment folder.

use anyhow::{Context, bail};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The plot's font, embedded so plotting needs no system fonts (DejaVu Sans Mono; licence in
/// `assets/DejaVu-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSansMono.ttf");

/// Arguments of `drill plot`.
#[derive(clap::Args)]
pub struct Args {
    /// Experiment folders written by `drill train`.
    #[arg(required = true)]
    pub exp_dirs: Vec<PathBuf>,
    /// Output PNG.
    #[arg(short, long, default_value = "curve.png")]
    pub output: PathBuf,
    /// Scalar to plot (any tag in metrics.jsonl).
    #[arg(long, default_value = "eval/episodic_return_mean")]
    pub tag: String,
}

/// `(step, value)` points of `tag` in `dir/metrics.jsonl`.
fn series(dir: &Path, tag: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut points = vec![];
    for (n, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), n + 1))?;
        if v["tag"] == tag
            && let (Some(s), Some(y)) = (v["step"].as_f64(), v["value"].as_f64())
        {
            points.push((s, y));
        }
    }
    if points.is_empty() {
        bail!("{} has no `{tag}` values", path.display());
    }
    Ok(points)
}

/// Draw the curves into `args.output`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let runs: Vec<(String, Vec<(f64, f64)>)> = args
        .exp_dirs
        .iter()
        .map(|d| {
            Ok((
                d.file_name()
                    .map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into()),
                series(d, &args.tag)?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("embedded font is invalid"))?;
    let x_max = runs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max);
    let (y_min, y_max) = runs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
            (a.min(y), b.max(y))
        });
    let pad = ((y_max - y_min) * 0.05).max(1.0);
    let root = BitMapBackend::new(&args.output, (960, 600)).into_drawing_area();
    let draw =
        |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot draw {}: {e}", args.output.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&args.tag, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("env steps")
        .y_desc("return")
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, (name, points)) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| draw(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    println!("{}", args.output.display());
    Ok(())
}
