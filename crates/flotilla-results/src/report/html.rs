//! The report as pictures: SVG figures drawn here (no plotting library, no network) — every
//! job's metric curves overlaid, each job's best metric value against each swept parameter
//! (log axis where a parameter spans more than two decades), parallel coordinates of parameters
//! → best metric with a colour bar, and the optimization history (each job's best value in job
//! order, the best so far) — and one self-contained HTML page holding them with the sortable
//! results table. Legends are fitted into the figure by `legend.rs`.

use super::legend;
use super::render::{number, param};
use super::{param_header, Mode, Report};
use std::fmt::Write as _;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;
/// The right margin of a figure without a legend.
const RIGHT_BARE: f64 = 24.0;
/// The font size of the figures' text (the `<svg>`'s `font-size`).
const FONT_SIZE: f64 = 11.0;
/// Room kept between a legend's longest line and the figure's right edge.
const LEGEND_MARGIN: f64 = 4.0;
/// Most distinct values an axis ticks one by one.
const MAX_VALUE_TICKS: usize = 6;
/// A text's white outline, so that lines under it do not strike it through.
const HALO: &str =
    "paint-order=\"stroke\" stroke=\"white\" stroke-width=\"3\" stroke-linejoin=\"round\"";

/// Colours of the jobs' lines (Tableau 10).
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A linear or log axis mapping data to pixels.
#[derive(Clone, Copy)]
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    from: f64,
    to: f64,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64> + Clone, from: f64, to: f64, allow_log: bool) -> Axis {
        let finite = values.filter(|v| v.is_finite());
        let lo = finite.clone().fold(f64::INFINITY, f64::min);
        let hi = finite.fold(f64::NEG_INFINITY, f64::max);
        let (mut lo, mut hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
        let log = allow_log && lo > 0.0 && hi / lo > 100.0;
        if log {
            // 5% of the decades on each side, so no value sits on the axis line.
            let (l, h) = (lo.log10(), hi.log10());
            let pad = (h - l) * 0.05;
            lo = 10f64.powf(l - pad);
            hi = 10f64.powf(h + pad);
        } else {
            if lo == hi {
                let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
                lo -= pad;
                hi += pad;
            } else {
                let pad = (hi - lo) * 0.05;
                lo -= pad;
                hi += pad;
            }
        }
        Axis {
            lo,
            hi,
            log,
            from,
            to,
        }
    }

    fn map(&self, v: f64) -> f64 {
        let (lo, hi, v) = if self.log {
            (
                self.lo.log10(),
                self.hi.log10(),
                v.max(f64::MIN_POSITIVE).log10(),
            )
        } else {
            (self.lo, self.hi, v)
        };
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        self.from + t * (self.to - self.from)
    }

    /// The ticks of an axis of swept values: the values themselves when there are few (a grid's
    /// points), else round values.
    fn data_ticks(&self, values: impl Iterator<Item = f64>) -> Vec<f64> {
        let mut distinct: Vec<f64> = values.filter(|v| v.is_finite()).collect();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        if distinct.len() <= MAX_VALUE_TICKS {
            distinct
        } else {
            self.ticks()
        }
    }

    /// About five round tick values inside the axis.
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().floor() as i32,
                self.hi.log10().ceil() as i32,
            );
            return (a..=b)
                .map(|e| 10f64.powi(e))
                .filter(|v| *v >= self.lo * 0.999 && *v <= self.hi * 1.001)
                .collect();
        }
        let span = self.hi - self.lo;
        let raw = span / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(raw);
        let mut v = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while v <= self.hi + step * 1e-9 && out.len() < 20 {
            out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
            v += step;
        }
        out
    }
}

struct Svg {
    body: String,
    /// The right end of the plot area (left of the legend, when there is one).
    right: f64,
}

impl Svg {
    /// A figure with room for a legend on the right.
    fn new(title: &str) -> Svg {
        Svg::with_right(title, WIDTH - RIGHT)
    }

    /// A figure without a legend: the plot takes the width.
    fn bare(title: &str) -> Svg {
        Svg::with_right(title, WIDTH - RIGHT_BARE)
    }

    fn with_right(title: &str, right: f64) -> Svg {
        let mut body = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"{FONT_SIZE}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            body,
            "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            LEFT,
            escape(title)
        );
        Svg { body, right }
    }

    /// The axis lines, the y ticks, the x ticks of a numeric x axis (`None`: the caller labels
    /// categories) and both labels.
    fn axes(&mut self, x: Option<&Axis>, y: &Axis, x_label: &str, y_label: &str) {
        let (x0, x1, y0, y1) = (LEFT, self.right, HEIGHT - BOTTOM, TOP);
        let _ = writeln!(
            self.body,
            "<path d=\"M{x0},{y1} L{x0},{y0} L{x1},{y0}\" stroke=\"#333\" fill=\"none\"/>"
        );
        for (x, t) in x
            .into_iter()
            .flat_map(|x| x.ticks().into_iter().map(move |t| (x, t)))
        {
            let px = x.map(t);
            let _ = writeln!(
                self.body,
                "<line x1=\"{px:.1}\" y1=\"{y0}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                y0 + 4.0,
                y0 + 16.0,
                number(t)
            );
        }
        for t in y.ticks() {
            let py = y.map(t);
            let _ = writeln!(
                self.body,
                "<line x1=\"{x0}\" y1=\"{py:.1}\" x2=\"{x1}\" y2=\"{py:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                x0 - 4.0,
                py + 4.0,
                number(t)
            );
        }
        let _ = writeln!(
            self.body,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text><text transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            (x0 + x1) / 2.0,
            HEIGHT - 12.0,
            escape(x_label),
            (y0 + y1) / 2.0,
            escape(y_label)
        );
    }

    /// The legend in the column right of the plot: a colour swatch and its label per entry,
    /// each label wrapped, or cut with its whole text as the entry's `<title>`, so that it fits
    /// inside the figure ([`super::legend`]).
    fn legend(&mut self, labels: &[(String, &str)]) {
        let x = WIDTH - RIGHT + 12.0;
        let (text_x, first) = (x + 14.0, TOP + 8.0);
        let texts: Vec<&str> = labels.iter().map(|(l, _)| l.as_str()).collect();
        let layout = legend::layout(
            &texts,
            WIDTH - LEGEND_MARGIN - text_x,
            FONT_SIZE,
            first,
            HEIGHT - 12.0,
        );
        for ((entry, y), (label, colour)) in layout
            .entries
            .iter()
            .zip(layout.baselines(first))
            .zip(labels)
        {
            let mut lines = String::new();
            for (k, line) in entry.lines.iter().enumerate() {
                let _ = write!(
                    lines,
                    "<text x=\"{text_x}\" y=\"{}\">{}</text>",
                    y + k as f64 * legend::LINE_STEP,
                    escape(line)
                );
            }
            let swatch = format!(
                "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>",
                y - 9.0
            );
            if entry.cut {
                let _ = writeln!(
                    self.body,
                    "<g class=\"legend-entry\"><title>{}</title>{swatch}{lines}</g>",
                    escape(label)
                );
            } else {
                let _ = writeln!(self.body, "{swatch}{lines}");
            }
        }
        if layout.more > 0 {
            let _ = writeln!(
                self.body,
                "<text x=\"{text_x}\" y=\"{}\" fill=\"#555\">+{} more</text>",
                layout.end(first),
                layout.more
            );
        }
    }

    fn finish(mut self) -> String {
        self.body.push_str("</svg>\n");
        self.body
    }
}

/// The values in order of first appearance, each once.
fn distinct(values: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

fn job_label(report: &Report, i: usize) -> String {
    let row = &report.jobs[i];
    let params: Vec<String> = row
        .params
        .iter()
        .map(|(k, v)| format!("{}={}", k.rsplit('.').next().unwrap_or(k), param(v)))
        .collect();
    let num = match &row.sweep {
        Some(sweep) => format!("{sweep}/{}", row.num),
        None => row.num.to_string(),
    };
    if params.is_empty() {
        format!("job {num}")
    } else {
        format!("{num} {}", params.join(" "))
    }
}

/// Every job's series `name` against the step; `None` when no job logged it.
pub fn curves_svg(report: &Report, name: &str) -> Option<String> {
    let series: Vec<(usize, &Vec<(u64, f64)>)> = report
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.metrics.get(name).map(|s| (i, s)))
        .collect();
    if series.is_empty() {
        return None;
    }
    let points = series.iter().flat_map(|(_, s)| s.iter());
    let x = Axis::new(
        points.clone().map(|(s, _)| *s as f64),
        LEFT,
        WIDTH - RIGHT,
        false,
    );
    let y = Axis::new(points.map(|(_, v)| *v), HEIGHT - BOTTOM, TOP, false);
    let mut svg = Svg::new(&format!("{name} by step"));
    svg.axes(Some(&x), &y, "step", name);
    let mut legend = Vec::new();
    for (i, s) in &series {
        let path: Vec<String> = s
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(step, v)| format!("{:.1},{:.1}", x.map(*step as f64), y.map(*v)))
            .collect();
        let marker = if path.len() == 1 {
            format!(
                "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>",
                path[0].split(',').next().unwrap_or("0"),
                path[0].split(',').nth(1).unwrap_or("0"),
                colour(*i)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            svg.body,
            "<polyline class=\"curve\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>{marker}",
            path.join(" "),
            colour(*i)
        );
        legend.push((job_label(report, *i), colour(*i)));
    }
    svg.legend(&legend);
    Some(svg.finish())
}

/// Fewest jobs with a final value for the optimization history to be drawn.
const HISTORY_MIN_JOBS: usize = 3;

/// The optimization history: each job's best metric value (as the table's best column) in the
/// order the jobs were numbered (completed jobs filled, pruned and other unfinished ones
/// hollow) and the best completed value so far as a step line. With several sweeps, their jobs
/// follow each other sweep by sweep. `None` for fewer than three jobs with a value
/// (`HISTORY_MIN_JOBS`).
pub fn history_svg(report: &Report) -> Option<String> {
    let mut ordered: Vec<&super::JobRow> = report.jobs.iter().collect();
    ordered.sort_by(|a, b| a.sweep.cmp(&b.sweep).then(a.num.cmp(&b.num)));
    let several = report.spans_sweeps();
    let points: Vec<(usize, f64, bool)> = ordered
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let v = r.best.filter(|v| v.is_finite())?;
            Some((
                if several { i } else { r.num },
                v,
                r.state == flotilla_launch::rundir::JobState::Completed,
            ))
        })
        .collect();
    if points.len() < HISTORY_MIN_JOBS {
        return None;
    }
    let x = Axis::new(
        points.iter().map(|(n, _, _)| *n as f64),
        LEFT,
        WIDTH - RIGHT,
        false,
    );
    let y = Axis::new(
        points.iter().map(|(_, v, _)| *v),
        HEIGHT - BOTTOM,
        TOP,
        true,
    );
    let mut svg = Svg::new(&format!("optimization history: best {}", report.metric));
    svg.axes(
        Some(&x),
        &y,
        if several {
            "job (sweep by sweep)"
        } else {
            "job"
        },
        &format!("best {}", report.metric),
    );
    let mut best: Option<f64> = None;
    let mut line: Vec<String> = Vec::new();
    let mut sorted = points.clone();
    sorted.sort_by_key(|(n, _, _)| *n);
    for (n, v, completed) in &sorted {
        let (px, py) = (x.map(*n as f64), y.map(*v));
        let fill = if *completed { colour(0) } else { "none" };
        let _ = writeln!(
            svg.body,
            "<circle class=\"trial\" cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3.5\" fill=\"{fill}\" stroke=\"{}\"><title>job {n}: {}</title></circle>",
            colour(0),
            number(*v)
        );
        if !*completed {
            continue;
        }
        let improved = best.is_none_or(|b| report.mode.better(*v, b));
        if improved {
            if let Some(b) = best {
                line.push(format!("{px:.1},{:.1}", y.map(b)));
            }
            best = Some(*v);
        }
        line.push(format!("{px:.1},{:.1}", y.map(best.unwrap_or(*v))));
    }
    if let (Some(b), Some(last)) = (best, sorted.last()) {
        line.push(format!("{:.1},{:.1}", x.map(last.0 as f64), y.map(b)));
    }
    let _ = writeln!(
        svg.body,
        "<polyline class=\"best\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>",
        line.join(" "),
        colour(1)
    );
    svg.legend(&[
        ("completed".to_string(), colour(0)),
        ("best so far".to_string(), colour(1)),
    ]);
    Some(svg.finish())
}

/// The best metric value of each job against one parameter.
pub fn param_svg(report: &Report, key: &str) -> Option<String> {
    let points: Vec<(usize, &serde_json::Value, f64)> = report
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.params.get(key)?, r.best.filter(|b| b.is_finite())?)))
        .collect();
    if points.is_empty() {
        return None;
    }
    let numeric = points.iter().all(|(_, v, _)| v.is_number());
    let categories = distinct(points.iter().map(|(_, v, _)| param(v)));
    let xs: Vec<f64> = points
        .iter()
        .map(|(_, v, _)| {
            if numeric {
                v.as_f64().unwrap_or(0.0)
            } else {
                categories.iter().position(|c| *c == param(v)).unwrap_or(0) as f64
            }
        })
        .collect();
    let right = WIDTH - RIGHT_BARE;
    let x = if numeric {
        Axis::new(xs.iter().copied(), LEFT, right, true)
    } else {
        // Categories in slots of equal width, none on the axis line.
        Axis {
            lo: -0.5,
            hi: categories.len() as f64 - 0.5,
            log: false,
            from: LEFT,
            to: right,
        }
    };
    let y = Axis::new(
        points.iter().map(|(_, _, b)| *b),
        HEIGHT - BOTTOM,
        TOP,
        false,
    );
    let mut svg = Svg::bare(&format!("best {} by {key}", report.metric));
    if numeric {
        svg.axes(
            Some(&x),
            &y,
            &format!("{key}{}", if x.log { " (log)" } else { "" }),
            &report.metric,
        );
    } else {
        svg.axes(None, &y, key, &report.metric);
        for (i, c) in categories.iter().enumerate() {
            let _ = writeln!(
                svg.body,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                x.map(i as f64),
                HEIGHT - BOTTOM + 16.0,
                escape(c)
            );
        }
    }
    for ((i, _, b), px) in points.iter().zip(&xs) {
        let _ = writeln!(
            svg.body,
            "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\"><title>job {}: {}</title></circle>",
            x.map(*px),
            y.map(*b),
            colour(*i),
            report.jobs[*i].num,
            number(*b)
        );
    }
    Some(svg.finish())
}

/// Where a job crosses one axis of the parallel coordinates, in pixels.
type AxisPosition = Box<dyn Fn(&super::JobRow) -> f64>;

/// The colour of a job in the parallel coordinates: `t` from 0 (the best) to 1 (the worst),
/// dark to light blue.
fn shade(t: f64) -> String {
    let s = (40.0 + t.clamp(0.0, 1.0) * 170.0) as u8;
    format!("rgb({s},{s},230)")
}

/// Parallel coordinates: one axis per parameter and one for the metric, each ticked at its
/// values (a grid's) or at round ones, a log axis marked so; each job a line coloured from
/// best (dark) to worst (light), with a colour bar saying which is which. Labels are drawn over
/// the lines with a white outline, so no line strikes them through.
pub fn parallel_svg(report: &Report) -> Option<String> {
    let keys = report.param_keys();
    if keys.is_empty() {
        return None;
    }
    let rows: Vec<&super::JobRow> = report
        .jobs
        .iter()
        .filter(|r| r.best.is_some_and(f64::is_finite))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let n_axes = keys.len() + 1;
    // The metric's axis, then room for its labels and the colour bar.
    let last_axis = WIDTH - 150.0;
    let spacing = (last_axis - LEFT) / (n_axes.max(2) - 1) as f64;
    let mut svg = Svg::new(&format!("parameters → best {}", report.metric));
    let (y0, y1) = (HEIGHT - BOTTOM, TOP + 10.0);
    let mut axes: Vec<AxisPosition> = Vec::new();
    // Drawn after the lines: axis lines, names and tick labels.
    let mut over = String::new();
    let axis_line = |over: &mut String, px: f64, name: &str| {
        let _ = writeln!(
            over,
            "<line x1=\"{px:.1}\" y1=\"{y0}\" x2=\"{px:.1}\" y2=\"{y1}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\" {HALO}>{}</text>",
            y0 + 16.0,
            escape(name)
        );
    };
    let tick = |over: &mut String, px: f64, py: f64, label: &str| {
        let _ = writeln!(
            over,
            "<line x1=\"{:.1}\" y1=\"{py:.1}\" x2=\"{px:.1}\" y2=\"{py:.1}\" stroke=\"#333\"/><text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" {HALO}>{}</text>",
            px - 3.0,
            px + 4.0,
            py + 3.5,
            escape(label)
        );
    };
    for (a, key) in keys.iter().enumerate() {
        let values: Vec<&serde_json::Value> =
            rows.iter().filter_map(|r| r.params.get(key)).collect();
        let px = LEFT + a as f64 * spacing;
        if values.iter().all(|v| v.is_number()) {
            let numbers = || values.iter().filter_map(|v| v.as_f64());
            let axis = Axis::new(numbers(), y0, y1, true);
            let name = if axis.log {
                format!("{key} (log)")
            } else {
                key.clone()
            };
            axis_line(&mut over, px, &name);
            for t in axis.data_ticks(numbers()) {
                tick(&mut over, px, axis.map(t), &number(t));
            }
            let key = key.clone();
            axes.push(Box::new(move |r| {
                axis.map(
                    r.params
                        .get(&key)
                        .and_then(|v| v.as_f64())
                        .unwrap_or(axis.lo),
                )
            }));
        } else {
            axis_line(&mut over, px, key);
            let cats = distinct(values.iter().map(|v| param(v)));
            // Categories in slots of equal height, none at the axis ends.
            let slot = (y0 - y1) / cats.len().max(1) as f64;
            let at = move |i: usize| y0 - (i as f64 + 0.5) * slot;
            for (i, c) in cats.iter().enumerate() {
                tick(&mut over, px, at(i), c);
            }
            let key = key.clone();
            axes.push(Box::new(move |r| {
                let s = r.params.get(&key).map(param).unwrap_or_default();
                at(cats.iter().position(|c| *c == s).unwrap_or(0))
            }));
        }
    }
    let metric_axis = Axis::new(rows.iter().filter_map(|r| r.best), y0, y1, false);
    let px = last_axis;
    axis_line(&mut over, px, &format!("best {}", report.metric));
    for t in metric_axis.ticks() {
        tick(&mut over, px, metric_axis.map(t), &number(t));
    }
    axes.push(Box::new(move |r| {
        metric_axis.map(r.best.unwrap_or(metric_axis.lo))
    }));
    // 0 for the best value, 1 for the worst.
    let (lo, hi) = rows
        .iter()
        .filter_map(|r| r.best)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    let badness = |v: f64| {
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
        if report.mode == Mode::Max {
            1.0 - t
        } else {
            t
        }
    };
    // Worst first, so the best lines are drawn on top.
    let mut ordered = rows.clone();
    ordered.sort_by(|a, b| badness(b.best.unwrap_or(lo)).total_cmp(&badness(a.best.unwrap_or(lo))));
    for r in ordered {
        let points: Vec<String> = axes
            .iter()
            .enumerate()
            .map(|(a, f)| format!("{:.1},{:.1}", LEFT + a as f64 * spacing, f(r)))
            .collect();
        let _ = writeln!(
            svg.body,
            "<polyline class=\"pc\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"><title>job {}: {}</title></polyline>",
            points.join(" "),
            shade(badness(r.best.unwrap_or(lo))),
            r.num,
            number(r.best.unwrap_or(lo))
        );
    }
    svg.body.push_str(&over);
    // The colour bar: the metric's range from the bottom (its axis's low end) to the top.
    let (bx, bw) = (WIDTH - 62.0, 12.0);
    let stops: Vec<String> = (0..=10)
        .map(|i| {
            let v = lo + (hi - lo) * i as f64 / 10.0;
            format!(
                "<stop offset=\"{}%\" stop-color=\"{}\"/>",
                i * 10,
                shade(badness(v))
            )
        })
        .collect();
    let (bar_top, bar_bottom) = (metric_axis.map(hi), metric_axis.map(lo));
    let _ = writeln!(
        svg.body,
        "<defs><linearGradient id=\"pc-colour\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">{}</linearGradient></defs><rect class=\"colourbar\" x=\"{bx}\" y=\"{bar_top:.1}\" width=\"{bw}\" height=\"{:.1}\" fill=\"url(#pc-colour)\" stroke=\"#999\"/>",
        stops.join(""),
        (bar_bottom - bar_top).max(1.0)
    );
    let (best_y, worst_y) = match report.mode {
        Mode::Min => (bar_bottom, bar_top),
        Mode::Max => (bar_top, bar_bottom),
    };
    for (y, word) in [(best_y, "best"), (worst_y, "worst")] {
        let _ = writeln!(
            svg.body,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{word}</text>",
            bx + bw + 4.0,
            y + 3.5
        );
    }
    let _ = writeln!(
        svg.body,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
        bx + bw / 2.0,
        bar_top - 6.0,
        escape(&report.metric)
    );
    Some(svg.finish())
}

/// All figures of a report, named for files (`curves_loss.svg`, `param_trainer.lr.svg`,
/// `parallel.svg`).
pub fn figures(report: &Report) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut names = vec!["loss".to_string()];
    if report.metric != "loss" {
        names.push(report.metric.clone());
    }
    for name in names {
        if let Some(svg) = curves_svg(report, &name) {
            out.push((format!("curves_{name}.svg"), svg));
        }
    }
    for key in report.param_keys() {
        if let Some(svg) = param_svg(report, &key) {
            out.push((format!("param_{}.svg", key.replace('/', "_")), svg));
        }
    }
    if let Some(svg) = parallel_svg(report) {
        out.push(("parallel.svg".into(), svg));
    }
    if let Some(svg) = history_svg(report) {
        out.push(("history.svg".into(), svg));
    }
    out
}

const SORT_SCRIPT: &str = r#"
document.querySelectorAll('table.report th').forEach((th, col) => {
  th.addEventListener('click', () => {
    const body = th.closest('table').tBodies[0];
    const rows = Array.from(body.rows);
    const dir = th.dataset.dir === 'asc' ? -1 : 1;
    th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    const key = r => r.cells[col].dataset.v ?? r.cells[col].textContent;
    rows.sort((a, b) => {
      const x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      if (x === '' && y !== '') return 1;
      if (y === '' && x !== '') return -1;
      return (isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny) * dir;
    });
    rows.forEach(r => body.appendChild(r));
  });
});
document.body.dataset.ready = 'yes';
"#;

/// One self-contained page: the sortable table, then every figure.
pub fn page(report: &Report, title: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>body{{font-family:sans-serif;margin:24px;color:#222}} table.report{{border-collapse:collapse;font-size:13px}} th,td{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}} th{{cursor:pointer;background:#f4f4f4}} td.text,th.text{{text-align:left}} tr.best td{{font-weight:bold;background:#eef6ee}} .figures svg{{margin:8px;border:1px solid #eee}}</style></head>\n<body><h1>{t}</h1>\n<p>metric: <b>{m}</b> ({mode}; a job's best is its {extreme} value at any step, the best job is marked); {n} job{s}; click a column to sort.</p>\n",
        t = escape(title),
        m = escape(&report.metric),
        mode = if report.mode == Mode::Min { "lower is better" } else { "higher is better" },
        extreme = if report.mode == Mode::Min { "lowest" } else { "highest" },
        n = report.jobs.len(),
        s = if report.jobs.len() == 1 { "" } else { "s" },
    );
    let keys = report.param_keys();
    let sweeps = report.spans_sweeps();
    html.push_str("<table class=\"report\"><thead><tr><th>num</th>");
    if sweeps {
        html.push_str("<th class=\"text\">sweep</th>");
    }
    html.push_str("<th class=\"text\">state</th>");
    for k in &keys {
        let _ = write!(html, "<th class=\"text\">{}</th>", escape(&param_header(k)));
    }
    let _ = writeln!(
        html,
        "<th>final {m}</th><th>{b}</th><th>best step</th><th>steps</th><th>wall s</th><th>tokens/s</th><th class=\"text\">note</th></tr></thead><tbody>",
        m = escape(&report.metric),
        b = escape(&report.best_header())
    );
    let cell = |x: Option<f64>| match x {
        Some(v) => format!("<td data-v=\"{v}\">{}</td>", number(v)),
        None => "<td data-v=\"\"></td>".to_string(),
    };
    for r in &report.jobs {
        let _ = write!(
            html,
            "<tr{}><td>{}</td>",
            if report.is_best(r) {
                " class=\"best\""
            } else {
                ""
            },
            r.num,
        );
        if sweeps {
            let _ = write!(
                html,
                "<td class=\"text\">{}</td>",
                escape(r.sweep.as_deref().unwrap_or(""))
            );
        }
        let _ = write!(html, "<td class=\"text\">{}</td>", r.state);
        for k in &keys {
            let v = r.params.get(k).map(param).unwrap_or_default();
            let _ = write!(html, "<td class=\"text\">{}</td>", escape(&v));
        }
        html.push_str(&cell(r.final_value));
        html.push_str(&cell(r.best));
        html.push_str(&cell(r.best_step.map(|s| s as f64)));
        html.push_str(&cell(Some(r.steps as f64)));
        html.push_str(&cell(r.wall_s));
        html.push_str(&cell(r.tokens_per_s.map(f64::round)));
        let _ = writeln!(
            html,
            "<td class=\"text\">{}</td></tr>",
            escape(r.reason.as_deref().unwrap_or(""))
        );
    }
    html.push_str("</tbody></table>\n<div class=\"figures\">\n");
    for (_, svg) in figures(report) {
        html.push_str(&svg);
    }
    let _ = write!(
        html,
        "</div>\n<script>{SORT_SCRIPT}</script>\n</body></html>\n"
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{BestJob, JobRow};
    use flotilla_launch::rundir::JobState;
    use indexmap::IndexMap;
    use std::path::PathBuf;

    /// A grid of `lr` × `warmup` × `schedule` whose best values fall with the warmup.
    fn grid() -> Report {
        let mut jobs = Vec::new();
        for (i, (lr, warmup, schedule)) in [1e-4, 1e-3, 1e-2, 1e-1]
            .iter()
            .flat_map(|lr| {
                [10, 50]
                    .into_iter()
                    .flat_map(move |w| ["cosine", "linear"].map(move |s| (*lr, w, s)))
            })
            .enumerate()
        {
            let params: IndexMap<String, serde_json::Value> = [
                ("trainer.lr".to_string(), serde_json::json!(lr)),
                (
                    "trainer.warmup_steps".to_string(),
                    serde_json::json!(warmup),
                ),
                ("trainer.schedule".to_string(), serde_json::json!(schedule)),
            ]
            .into_iter()
            .collect();
            let best = 0.5 + i as f64 * 0.01 + warmup as f64 / 100.0;
            jobs.push(JobRow {
                num: i,
                dir: PathBuf::from(format!("s/{i}")),
                sweep: None,
                state: JobState::Completed,
                params,
                final_value: Some(best),
                best: Some(best),
                best_step: Some(9),
                steps: 10,
                wall_s: None,
                tokens_per_s: None,
                reason: None,
                metrics: Default::default(),
            });
        }
        Report {
            metric: "eval_loss".into(),
            mode: Mode::Min,
            best: Some(BestJob {
                num: 0,
                dir: PathBuf::from("s/0"),
            }),
            jobs,
        }
    }

    /// The texts of the elements of `class`.
    fn texts<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        svg.split(&format!("class=\"{class}\""))
            .skip(1)
            .filter_map(|s| s.split_once('>').map(|(_, rest)| rest))
            .filter_map(|s| s.split_once('<').map(|(text, _)| text))
            .collect()
    }

    #[test]
    fn parallel_axes_tick_data_values_mark_log_and_carry_a_colour_bar() {
        let report = grid();
        let svg = parallel_svg(&report).unwrap();
        let ticks = texts(&svg, "tick");
        // Each swept value once, as written; no padded ends.
        for value in [
            "1e-4", "0.001", "0.01", "0.1", "10", "50", "cosine", "linear",
        ] {
            assert_eq!(
                ticks.iter().filter(|t| **t == value).count(),
                1,
                "{value} in {ticks:?}"
            );
        }
        assert!(!ticks.iter().any(|t| *t == "8" || *t == "52"), "{ticks:?}");
        assert!(svg.contains(">trainer.lr (log)<"), "{svg}");
        assert!(svg.contains(">trainer.warmup_steps<"), "{svg}");
        // Labels are drawn over the lines, with a halo.
        let last_line = svg.rfind("<polyline").unwrap();
        let first_tick = svg.find("class=\"tick\"").unwrap();
        assert!(last_line < first_tick);
        assert!(svg.split("class=\"tick\"").skip(1).all(|s| s
            .split_once('>')
            .unwrap()
            .0
            .contains("paint-order=\"stroke\"")));
        // The colour bar, best at the low end for a loss.
        assert!(svg.contains("class=\"colourbar\"") && svg.contains("url(#pc-colour)"));
        assert!(svg.contains(">best</text>") && svg.contains(">worst</text>"));
        // titled with the metric it colours by
        assert!(svg.contains(&format!(">{}</text>", report.metric)), "{svg}");
        // The best job's line is the darkest and drawn last.
        let last = &svg[last_line..];
        assert!(last.contains("<title>job 0: 0.6</title>"), "{last}");
        assert!(last.contains(&shade(0.0)), "{last}");
    }

    #[test]
    fn scatter_points_use_the_width_and_stay_off_the_axis_line() {
        let report = grid();
        for key in ["trainer.lr", "trainer.warmup_steps", "trainer.schedule"] {
            let svg = param_svg(&report, key).unwrap();
            let xs: Vec<f64> = svg
                .split("class=\"point\" cx=\"")
                .skip(1)
                .map(|s| s.split('"').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(xs.len(), 16, "{key}");
            let (lo, hi) = xs
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                    (a.min(*x), b.max(*x))
                });
            assert!(
                lo > LEFT + 10.0,
                "{key}: a point at x={lo} sits on the axis line"
            );
            if key == "trainer.schedule" {
                // Categories centred in slots of equal width across the plot.
                let (left_gap, right_gap) = (lo - LEFT, WIDTH - RIGHT_BARE - hi);
                assert!((left_gap - right_gap).abs() < 1.0, "{key}: {lo}..{hi}");
            } else {
                assert!(hi > WIDTH - RIGHT + 40.0, "{key}: the points end at x={hi}");
            }
            assert!(hi < WIDTH - RIGHT_BARE, "{key}: x={hi} is off the plot");
        }
    }
}
