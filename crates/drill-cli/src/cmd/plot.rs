//! `drill plot`: a scalar (by default the evaluation return) against env steps or wall time.
//! Runs of the same config (the resolved config.toml minus `seed` and `exp_name`) are one
//! line: the mean over seeds, with a band from the lowest to the highest seed; a seed that
//! ends before the others keeps its last value (marked with a dot where it ended).

use ab_glyph::{Font, FontRef, PxScale, ScaleFont, point};
use anyhow::{Context, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{BoldPoints, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The plot's font, embedded so plotting needs no system fonts (DejaVu Sans; licence in
/// `assets/DejaVu-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
/// Image size in pixels.
pub const SIZE: (u32, u32) = (1000, 560);
/// Width of the legend column right of the chart.
const LEGEND_WIDTH: u32 = 240;
/// Labelled ticks per axis (at most).
const TICKS: usize = 8;

/// Arguments of `drill plot`.
#[derive(clap::Args)]
pub struct Args {
    /// Experiment folders written by `drill train` (seeds of one config become one line).
    #[arg(required = true)]
    pub exp_dirs: Vec<PathBuf>,
    /// Output PNG.
    #[arg(short, long, default_value = "curve.png")]
    pub output: PathBuf,
    /// Scalar to plot (any tag in metrics.jsonl).
    #[arg(long, default_value = "eval/episodic_return_mean")]
    pub tag: String,
    /// X axis: env steps, or wall-clock seconds since each run's first value.
    #[arg(long, value_enum, default_value = "steps")]
    pub x: XAxis,
    /// Average each run over its last N points before combining the seeds (1: raw).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub smooth: u32,
    /// One line per folder, even for runs of one config (to compare how two runs of it went).
    #[arg(long)]
    pub each: bool,
}

/// `--x`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxis {
    /// Env steps.
    Steps,
    /// Seconds of training since the run's first value; a run continued with `--resume`
    /// goes on from the training time its checkpoint carried, the pause left out.
    Wall,
}

/// One run's points of the tag, `(x, value)` in x order.
fn series(dir: &Path, tag: &str, x: XAxis) -> anyhow::Result<Vec<(f64, f64)>> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    // (env step, training seconds, value) of each of the tag's values.
    let mut points: Vec<(f64, f64, f64)> = vec![];
    // Training seconds where the current part of the run (the first, or one continued from
    // a checkpoint) began, and the wall-clock time it began at.
    let (mut base, mut began) = (0.0, None);
    let mut last_seconds = 0.0;
    // A run still going may be halfway through writing its last line (no newline yet): that
    // line is left for the next plot; a bad line anywhere else is an error.
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    for (n, line) in complete.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), n + 1))?;
        let wall = v["wall_time"].as_f64().unwrap_or(0.0);
        if v["tag"] == drill_exp::RESUMED_TAG {
            // Values an earlier attempt logged past the checkpoint were done again after it.
            let from = v["step"].as_f64().unwrap_or(0.0);
            points.retain(|p| p.0 <= from);
            // The checkpoint's training time; unknown (an older checkpoint), the last line's.
            base = v["value"].as_f64().unwrap_or(last_seconds);
            began = Some(wall);
            last_seconds = base;
            continue;
        }
        let seconds = base + (wall - *began.get_or_insert(wall));
        last_seconds = seconds;
        if v["tag"] == tag
            && let (Some(s), Some(y)) = (v["step"].as_f64(), v["value"].as_f64())
        {
            points.push((s, seconds, y));
        }
    }
    if points.is_empty() {
        bail!("{} has no `{tag}` values", path.display());
    }
    let mut points: Vec<(f64, f64)> = points
        .into_iter()
        .map(|(s, t, y)| (if x == XAxis::Wall { t } else { s }, y))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(points)
}

/// The group a run belongs to (its config without seed and name) and its label (the
/// folder's name without `_seedN`).
fn group_of(dir: &Path) -> (String, String) {
    let name = || {
        dir.file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into())
    };
    let Ok(text) = std::fs::read_to_string(dir.join("config.toml")) else {
        return (dir.display().to_string(), name());
    };
    let Ok(mut table) = text.parse::<toml::Table>() else {
        return (dir.display().to_string(), name());
    };
    table.remove("exp_name");
    table.remove("seed");
    let name = name();
    let stem = match name.rsplit_once("_seed") {
        Some((stem, n)) if n.bytes().all(|b| b.is_ascii_digit()) => stem.to_string(),
        _ => name,
    };
    (table.to_string(), stem)
}

/// Each point replaced by the mean of it and up to `n - 1` before it.
fn smooth(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let w = &points[i.saturating_sub(n - 1)..=i];
            (
                points[i].0,
                w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64,
            )
        })
        .collect()
}

/// One run's `(x, value)` points.
type Points = Vec<(f64, f64)>;
/// `(x, mean, min, max)` over a group's runs.
type Band = (f64, f64, f64, f64);
/// A line of the chart: its legend name, its points and where its early seeds end.
type Line = (String, Vec<Band>, Points);

/// Mean, min and max over `runs` at every x any of them has, each run holding its last
/// value from then on: past its own last x (a seed that reached the stop value or was
/// stopped), its last evaluation is carried forward, so every seed counts to the end of the
/// line ([`ends`] marks where each stopped).
fn combine(runs: &[Points]) -> Vec<Band> {
    let mut xs: Vec<f64> = runs.iter().flatten().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs.into_iter()
        .filter_map(|x| {
            let at: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.iter().take_while(|p| p.0 <= x).last().map(|p| p.1))
                .collect();
            (!at.is_empty()).then(|| {
                let mean = at.iter().sum::<f64>() / at.len() as f64;
                let lo = at.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = at.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (x, mean, lo, hi)
            })
        })
        .collect()
}

/// Where the seeds of a group that end before its last x stop: `(x, line value there)` for
/// each such seed (a run of one seed has none).
fn ends(runs: &[Points], line: &[Band]) -> Points {
    let last = line.last().map_or(f64::NEG_INFINITY, |p| p.0);
    runs.iter()
        .filter_map(|r| r.last().map(|p| p.0))
        .filter(|&x| x < last)
        .filter_map(|x| line.iter().find(|p| p.0 == x).map(|p| (x, p.1)))
        .collect()
}

/// `1.5M`, `10k`, `250`: an axis tick.
fn tick(v: f64) -> String {
    let (div, suffix) = [(1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| v.abs() >= *d)
        .unwrap_or((1.0, ""));
    let s = format!("{:.1}", v / div);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{suffix}")
}

/// A title for well-known tags (`eval/episodic_return_mean` is "evaluation return").
fn title(tag: &str) -> String {
    match tag {
        "eval/episodic_return_mean" => "Evaluation return".into(),
        "charts/episodic_return" => "Training episode return".into(),
        other => other.into(),
    }
}

/// Text drawn with the font's own advances, kerning and side bearings. (plotters 0.3.7's
/// ab_glyph text drops each glyph's left side bearing, which spaces letters unevenly:
/// "env s teps"; so every text of the plot is drawn here.)
struct Type<'a> {
    font: FontRef<'a>,
}

/// How a text is drawn: size in pixels, where its anchor is, colour, and whether it is
/// turned a quarter to the left (read bottom to top; the anchor then on its left edge).
#[derive(Clone, Copy)]
struct Style {
    size: f32,
    anchor: Anchor,
    color: RGBAColor,
    vertical: bool,
}

/// Where a text's anchor point is.
#[derive(Clone, Copy)]
enum Anchor {
    /// Top left corner.
    Left,
    /// Middle of the top edge.
    Center,
    /// Top right corner.
    Right,
}

impl Type<'_> {
    /// Width in pixels of `text` at `size`.
    fn width(&self, size: f32, text: &str) -> f32 {
        let f = self.font.as_scaled(PxScale::from(size));
        let mut w = 0.0;
        let mut prev = None;
        for c in text.chars() {
            let id = f.glyph_id(c);
            if let Some(p) = prev {
                w += f.kern(p, id);
            }
            w += f.h_advance(id);
            prev = Some(id);
        }
        w
    }

    /// Draw `text` with its anchor at `at`.
    fn draw(
        &self,
        area: &DrawingArea<BitMapBackend<'_>, Shift>,
        text: &str,
        at: (i32, i32),
        style: Style,
    ) {
        let Style {
            size,
            anchor,
            color,
            vertical,
        } = style;
        let f = self.font.as_scaled(PxScale::from(size));
        let width = self.width(size, text);
        let start = match anchor {
            Anchor::Left => 0.0,
            Anchor::Center => -width / 2.0,
            Anchor::Right => -width,
        };
        let mut pen = start;
        let mut prev = None;
        for c in text.chars() {
            let id = f.glyph_id(c);
            if let Some(p) = prev {
                pen += f.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(PxScale::from(size), point(pen, f.ascent()));
            pen += f.h_advance(id);
            let Some(outline) = self.font.outline_glyph(glyph) else {
                continue;
            };
            let b = outline.px_bounds();
            outline.draw(|gx, gy, coverage| {
                let (x, y) = (b.min.x as i32 + gx as i32, b.min.y as i32 + gy as i32);
                let (px, py) = if vertical {
                    (at.0 + y, at.1 - x)
                } else {
                    (at.0 + x, at.1 + y)
                };
                let alpha = color.3 * f64::from(coverage.clamp(0.0, 1.0));
                let _ = area.draw_pixel((px, py), &RGBAColor(color.0, color.1, color.2, alpha));
            });
        }
    }
}

/// Draw the curves into `args.output`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let lines = load_lines(&args)?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("embedded font is invalid"))?;
    let all = lines.iter().flat_map(|(_, p, _)| p.iter());
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let (y_min, y_max) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
        (a.min(p.2), b.max(p.3))
    });
    let pad = match (y_max - y_min) * 0.05 {
        p if p > 0.0 => p,
        _ => y_max.abs().max(1.0) * 0.05,
    };
    let root = BitMapBackend::new(&args.output, SIZE).into_drawing_area();
    let draw =
        |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot draw {}: {e}", args.output.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let (plot, _legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .margin_top(56)
        .margin_right(16)
        .x_label_area_size(64)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
        .map_err(|e| draw(&e))?;
    // plotters draws the grid and tick marks; the texts are drawn below, by `Type`.
    chart
        .configure_mesh()
        .x_labels(TICKS)
        .y_labels(TICKS)
        .light_line_style(WHITE)
        .bold_line_style(BLACK.mix(0.12))
        .x_label_formatter(&|_| String::new())
        .y_label_formatter(&|_| String::new())
        .draw()
        .map_err(|e| draw(&e))?;
    draw_curves(&mut chart, &lines).map_err(|e| draw(&e))?;
    let ty = Type {
        font: FontRef::try_from_slice(FONT).context("the embedded font is invalid")?,
    };
    let x_desc = match args.x {
        XAxis::Steps => "env steps",
        XAxis::Wall => "seconds",
    };
    let frame = chart_frame(&chart, x_max, (y_min - pad, y_max + pad));
    draw_labels(&root, &ty, &chart, frame, &args.tag, x_desc);
    draw_legend(&root, &ty, &lines, frame.3 + 10).map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    println!("{}", args.output.display());
    Ok(())
}

/// Text colours: titles and names, tick values and notes.
const INK: RGBAColor = RGBAColor(0, 0, 0, 1.0);
const GREY: RGBAColor = RGBAColor(60, 60, 60, 1.0);

/// A text style.
fn style(size: f32, anchor: Anchor, color: RGBAColor, vertical: bool) -> Style {
    Style {
        size,
        anchor,
        color,
        vertical,
    }
}

/// The runs of `args`, one line per config (seeds combined; with `--each`, per folder), in
/// the order given.
fn load_lines(args: &Args) -> anyhow::Result<Vec<Line>> {
    // Groups in the order their first folder was given.
    let mut groups: Vec<(String, String, Vec<Points>)> = Vec::new();
    for dir in &args.exp_dirs {
        let points = smooth(&series(dir, &args.tag, args.x)?, args.smooth as usize);
        let (mut key, label) = group_of(dir);
        if args.each {
            key = dir.display().to_string();
        }
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.2.push(points),
            None => groups.push((key, label, vec![points])),
        }
    }
    // Two configs that share a name are told apart by number.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let lines: Vec<Line> = groups
        .iter()
        .map(|(_, label, runs)| {
            let k = seen.entry(label.clone()).or_default();
            *k += 1;
            let name = if *k > 1 {
                format!("{label} ({k})")
            } else {
                label.clone()
            };
            let name = match runs.len() {
                1 => name,
                n => format!("{name}, {n} seeds"),
            };
            let line = combine(runs);
            let stops = ends(runs, &line);
            (name, line, stops)
        })
        .collect();
    Ok(lines)
}

/// The chart's drawing type.
type Chart<'a> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Each line: its min-max band, the mean, a dot where a seed stopped.
fn draw_curves(
    chart: &mut Chart<'_>,
    lines: &[Line],
) -> Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>> {
    for (i, (_, points, stops)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if points.iter().any(|p| p.2 < p.3) {
            let band: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (p.0, p.3))
                .chain(points.iter().rev().map(|p| (p.0, p.2)))
                .collect();
            chart.draw_series(std::iter::once(Polygon::new(
                band,
                color.mix(0.18).filled(),
            )))?;
        }
        chart.draw_series(LineSeries::new(
            points.iter().map(|p| (p.0, p.1)),
            color.stroke_width(2),
        ))?;
        chart.draw_series(stops.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
    }
    Ok(())
}

/// The plot area's corners in pixels: left, bottom, right, top.
fn chart_frame(chart: &Chart<'_>, x_max: f64, (y_lo, y_hi): (f64, f64)) -> (i32, i32, i32, i32) {
    let (x0, y0) = chart.backend_coord(&(0.0, y_lo));
    let (x1, y1) = chart.backend_coord(&(x_max, y_hi));
    (x0, y0, x1, y1)
}

/// The title, the tick values and the axis names, in the embedded font.
fn draw_labels(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    ty: &Type,
    chart: &Chart<'_>,
    (x0, y0, x1, y1): (i32, i32, i32, i32),
    tag: &str,
    x_desc: &str,
) {
    let (ink, grey) = (INK, GREY);
    ty.draw(
        root,
        &title(tag),
        ((x0 + x1) / 2, 14),
        style(24.0, Anchor::Center, ink, false),
    );
    let spec = chart.as_coord_spec();
    for v in spec.x_spec().key_points(BoldPoints(TICKS)) {
        let (x, _) = chart.backend_coord(&(v, 0.0));
        ty.draw(
            root,
            &tick(v),
            (x, y0 + 8),
            style(14.0, Anchor::Center, grey, false),
        );
    }
    for v in spec.y_spec().key_points(BoldPoints(TICKS)) {
        let (_, y) = chart.backend_coord(&(0.0, v));
        ty.draw(
            root,
            &tick(v),
            (x0 - 8, y - 8),
            style(14.0, Anchor::Right, grey, false),
        );
    }
    ty.draw(
        root,
        x_desc,
        ((x0 + x1) / 2, y0 + 34),
        style(17.0, Anchor::Center, ink, false),
    );
    let y_desc = if tag.contains("return") {
        "return"
    } else {
        tag
    };
    let y_mid = (y0 + y1) / 2 + ty.width(17.0, y_desc) as i32 / 2;
    ty.draw(
        root,
        y_desc,
        (x0 - 72, y_mid),
        style(17.0, Anchor::Left, ink, true),
    );
}

/// The legend, in its own column right of the chart (never over the curves), from `top`.
fn draw_legend(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    ty: &Type,
    lines: &[Line],
    top: i32,
) -> Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>> {
    let (ink, grey) = (INK, GREY);
    let left = (SIZE.0 - LEGEND_WIDTH) as i32;
    let mut y = top;
    for (i, (name, _, _)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        root.draw(&PathElement::new(
            vec![(left + 8, y + 9), (left + 34, y + 9)],
            color.stroke_width(3),
        ))?;
        ty.draw(
            root,
            name,
            (left + 42, y),
            style(15.0, Anchor::Left, ink, false),
        );
        y += 26;
    }
    let mut notes = Vec::new();
    if lines.iter().any(|(n, _, _)| n.ends_with(" seeds")) {
        notes.push("line: mean over seeds; band: min to max");
    }
    if lines.iter().any(|(_, _, stops)| !stops.is_empty()) {
        notes.push("dot: a seed's last evaluation,");
        notes.push("carried forward past it");
    }
    for note in notes {
        ty.draw(
            root,
            note,
            (left + 8, y + 6),
            style(12.0, Anchor::Left, grey, false),
        );
        y += 16;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_smoothing_and_seeds_combined() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(250.0), "250");
        assert_eq!(tick(10_000.0), "10k");
        assert_eq!(tick(1_500_000.0), "1.5M");
        assert_eq!(tick(-120.0), "-120");
        let s = smooth(&[(0.0, 0.0), (1.0, 2.0), (2.0, 4.0)], 2);
        assert_eq!(s, vec![(0.0, 0.0), (1.0, 1.0), (2.0, 3.0)]);
        let c = combine(&[vec![(0.0, 1.0), (10.0, 3.0)], vec![(0.0, 5.0), (5.0, 7.0)]]);
        assert_eq!(
            c,
            vec![
                (0.0, 3.0, 1.0, 5.0),
                (5.0, 4.0, 1.0, 7.0),
                (10.0, 5.0, 3.0, 7.0)
            ]
        );
        // The second seed stopped at 5: its 7 is carried to 10, and its end is marked.
        let runs = [vec![(0.0, 1.0), (10.0, 3.0)], vec![(0.0, 5.0), (5.0, 7.0)]];
        assert_eq!(ends(&runs, &combine(&runs)), vec![(5.0, 4.0)]);
        assert!(ends(&runs[..1], &combine(&runs[..1])).is_empty());
    }

    /// A run stopped and continued twice: from `final` (its training time known), then after
    /// a crash from an older checkpoint written before drill counted training time.
    #[test]
    fn a_continued_run_is_one_line_in_training_time_without_its_pauses() {
        let dir = tempfile::tempdir().unwrap();
        let line = |tag: &str, step: u64, value: &str, wall: f64| {
            format!(r#"{{"tag":"{tag}","step":{step},"value":{value},"wall_time":{wall}}}"#)
        };
        let eval = "eval/episodic_return_mean";
        let resumed = drill_exp::RESUMED_TAG;
        let lines = [
            line(eval, 0, "-21", 1000.0),
            line("losses/value", 50, "0.5", 1005.0),
            line(eval, 100, "-15", 1010.0),
            // Stopped at step 150 after 12 s of training, continued an hour later.
            line(resumed, 150, "12.0", 4600.0),
            line(eval, 150, "-10", 4602.0),
            line(eval, 250, "-5", 4610.0),
            line(eval, 300, "0", 4615.0),
            // Crashed; restarted from a checkpoint at 250 that carries no training time.
            line(resumed, 250, "null", 9000.0),
            line(eval, 250, "-4", 9003.0),
            line(eval, 350, "3", 9010.0),
        ];
        std::fs::write(dir.path().join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        let steps = series(dir.path(), eval, XAxis::Steps).unwrap();
        let want = [
            (0.0, -21.0),
            (100.0, -15.0),
            (150.0, -10.0),
            (250.0, -5.0),
            (250.0, -4.0),
            (350.0, 3.0),
        ];
        assert_eq!(steps, want);
        // Seconds: 0 and 10; then from 12 on (+2, +10; the value at 300 done again is
        // dropped); the unknown time carries on from the last line before the crash (27 s).
        let wall = series(dir.path(), eval, XAxis::Wall).unwrap();
        let seconds: Vec<f64> = wall.iter().map(|p| p.0).collect();
        assert_eq!(seconds, [0.0, 10.0, 14.0, 22.0, 30.0, 37.0]);
        assert_eq!(
            wall.iter().map(|p| p.1).collect::<Vec<_>>(),
            [-21.0, -15.0, -10.0, -5.0, -4.0, 3.0]
        );
    }

    #[test]
    fn seeds_of_one_config_are_one_line_unless_each_is_asked_for() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plot");
        let args = |each| Args {
            exp_dirs: ["cp_seed0", "cp_seed1", "other"]
                .iter()
                .map(|d| fixtures.join(d))
                .collect(),
            output: "unused.png".into(),
            tag: "eval/episodic_return_mean".into(),
            x: XAxis::Steps,
            smooth: 1,
            each,
        };
        let names = |each| -> Vec<String> {
            load_lines(&args(each))
                .unwrap()
                .into_iter()
                .map(|l| l.0)
                .collect()
        };
        assert_eq!(names(false).len(), 2, "{:?}", names(false));
        assert_eq!(names(true).len(), 3, "{:?}", names(true));
    }
}
