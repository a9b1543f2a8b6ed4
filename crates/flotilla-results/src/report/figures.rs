//! The report's SVG figures: the metric curves by step, the best metric value against each
//! swept parameter (log axis where a parameter spans more than two decades), parallel
//! coordinates of parameters → best metric with a colour bar, and the optimization history
//! (each job's best value in job order, the best so far).
//!
//! Each job is drawn one by one up to [`MANY_JOBS`] jobs; above, the figures summarise, so that
//! a sweep of thousands of jobs stays readable and small: the curves of the best
//! [`CURVES_SHOWN`] jobs over the median and the 10–90% band of all jobs, the scatter points as
//! one path, at most [`PARALLEL_LINES`] lines of parallel coordinates (the best ones and an even
//! spread of the rest). A grouped report (`--group-by`) draws its configurations instead: mean
//! curves with a ± one standard deviation band, means with ± std error bars, lines through the
//! means.

use super::group::{mean_std, Group, Groups};
use super::render::{number, param};
use super::svg::{
    colour, distinct, escape, Axis, Svg, BOTTOM, HALO, HEIGHT, LEFT, RIGHT, RIGHT_BARE, TOP, WIDTH,
};
use super::{JobRow, Mode, Report};
use flotilla_launch::rundir::JobState;
use indexmap::IndexMap;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Above this many jobs, the figures summarise them instead of drawing each.
pub const MANY_JOBS: usize = 50;
/// Curves drawn one by one in a summarised curves figure: the best jobs or configurations.
pub const CURVES_SHOWN: usize = 10;
/// Most lines the parallel coordinates draw.
pub const PARALLEL_LINES: usize = 500;
/// Of them, the best jobs always drawn.
const PARALLEL_BEST: usize = 100;
/// Most points of one curve: a longer one is thinned to every k-th point (the last kept).
const CURVE_POINTS: usize = 400;
/// The grey of what summarises all jobs.
const GREY: &str = "#9a9a9a";

/// The order of two values, the better first, a missing or NaN value last.
fn better_first(mode: Mode, a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    let known = |v: Option<f64>| v.filter(|v| !v.is_nan());
    super::nones_last(known(a), known(b), |x, y| match mode {
        Mode::Min => x.total_cmp(&y),
        Mode::Max => y.total_cmp(&x),
    })
}

/// The indices of the jobs with a finite best value, the best first.
fn ranked_jobs(report: &Report) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..report.jobs.len())
        .filter(|i| report.jobs[*i].best.is_some_and(f64::is_finite))
        .collect();
    idx.sort_by(|a, b| better_first(report.mode, report.jobs[*a].best, report.jobs[*b].best));
    idx
}

/// The configurations with a mean, the best first.
fn ranked_groups(groups: &Groups, mode: Mode) -> Vec<&Group> {
    let mut ranked: Vec<&Group> = groups.groups.iter().filter(|g| g.mean.is_some()).collect();
    ranked.sort_by(|a, b| better_first(mode, a.mean, b.mean));
    ranked
}

/// A short label of parameters: `lr=0.1 seed=3` (each key by its last part).
fn params_label(params: &IndexMap<String, Value>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", k.rsplit('.').next().unwrap_or(k), param(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn job_label(row: &JobRow) -> String {
    let num = match &row.sweep {
        Some(sweep) => format!("{sweep}/{}", row.num),
        None => row.num.to_string(),
    };
    let params = params_label(&row.params);
    if params.is_empty() {
        format!("job {num}")
    } else {
        format!("{num} {params}")
    }
}

fn group_label(g: &Group) -> String {
    let params = params_label(&g.params);
    if params.is_empty() {
        format!("all jobs (n={})", g.n)
    } else {
        format!("{params} (n={})", g.n)
    }
}

/// Every k-th point of a long series (the last kept), at most [`CURVE_POINTS`].
fn thin<T: Copy>(points: &[T]) -> Vec<T> {
    if points.len() <= CURVE_POINTS {
        return points.to_vec();
    }
    let stride = points.len().div_ceil(CURVE_POINTS);
    let mut out: Vec<T> = points.iter().step_by(stride).copied().collect();
    if !(points.len() - 1).is_multiple_of(stride) {
        out.push(points[points.len() - 1]);
    }
    out
}

/// Per step, the finite values of several series.
fn by_step<'a>(series: impl Iterator<Item = &'a Vec<(u64, f64)>>) -> BTreeMap<u64, Vec<f64>> {
    let mut out: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for s in series {
        for (step, v) in s {
            if v.is_finite() {
                out.entry(*step).or_default().push(*v);
            }
        }
    }
    out
}

/// The value at quantile `q` of sorted values (the nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One line of a curves figure, with an optional band (`(step, low, high)`) under it.
struct Curve {
    label: String,
    colour: &'static str,
    points: Vec<(u64, f64)>,
    band: Vec<(u64, f64, f64)>,
    dashed: bool,
}

/// The curves of series `name` to draw, and what the figure's title adds.
fn curves_of(report: &Report, name: &str) -> (Vec<Curve>, String) {
    if let Some(groups) = &report.groups {
        let mut curves = Vec::new();
        for (k, g) in ranked_groups(groups, report.mode)
            .into_iter()
            .filter(|g| {
                g.rows
                    .iter()
                    .any(|i| report.jobs[*i].metrics.get(name).is_some())
            })
            .take(CURVES_SHOWN)
            .enumerate()
        {
            let steps = by_step(
                g.rows
                    .iter()
                    .filter_map(|i| report.jobs[*i].metrics.get(name)),
            );
            let mut points = Vec::new();
            let mut band = Vec::new();
            for (step, values) in &steps {
                let (mean, std) = mean_std(values);
                let mean = mean.unwrap_or(f64::NAN);
                points.push((*step, mean));
                if let Some(s) = std {
                    band.push((*step, mean - s, mean + s));
                }
            }
            curves.push(Curve {
                label: group_label(g),
                colour: colour(k),
                points,
                band,
                dashed: false,
            });
        }
        let shown = curves.len();
        return (
            curves,
            format!(
                ": mean ± std over {}{}",
                groups.by.join(", "),
                if groups.groups.len() > shown {
                    format!(
                        ", the {shown} best of {} configurations",
                        groups.groups.len()
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    let with: Vec<usize> = (0..report.jobs.len())
        .filter(|i| report.jobs[*i].metrics.get(name).is_some())
        .collect();
    if with.len() <= MANY_JOBS {
        let curves = with
            .iter()
            .map(|&i| Curve {
                label: job_label(&report.jobs[i]),
                colour: colour(i),
                points: report.jobs[i]
                    .metrics
                    .get(name)
                    .cloned()
                    .unwrap_or_default(),
                band: Vec::new(),
                dashed: false,
            })
            .collect();
        return (curves, String::new());
    }
    // Many jobs: the median and the 10–90% band of all of them, the best ones over it.
    let steps = by_step(
        with.iter()
            .filter_map(|i| report.jobs[*i].metrics.get(name)),
    );
    let (mut median, mut band) = (Vec::new(), Vec::new());
    for (step, values) in steps {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        median.push((step, quantile(&values, 0.5)));
        band.push((step, quantile(&values, 0.1), quantile(&values, 0.9)));
    }
    let mut curves = vec![Curve {
        label: format!("median, 10-90% of all {}", with.len()),
        colour: GREY,
        points: median,
        band,
        dashed: true,
    }];
    for (k, i) in ranked_jobs(report)
        .into_iter()
        .filter(|i| report.jobs[*i].metrics.get(name).is_some())
        .take(CURVES_SHOWN)
        .enumerate()
    {
        curves.push(Curve {
            label: job_label(&report.jobs[i]),
            colour: colour(k),
            points: report.jobs[i]
                .metrics
                .get(name)
                .cloned()
                .unwrap_or_default(),
            band: Vec::new(),
            dashed: false,
        });
    }
    let shown = curves.len() - 1;
    (curves, format!(": the {shown} best of {} jobs", with.len()))
}

/// The series `name` against the step: every job's, or (many jobs, or groups) a summary of
/// them; `None` when no job logged it.
pub fn curves_svg(report: &Report, name: &str) -> Option<String> {
    let (curves, note) = curves_of(report, name);
    if curves.is_empty() {
        return None;
    }
    let steps = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|(s, _)| *s as f64));
    let x = Axis::new(steps, LEFT, WIDTH - RIGHT, false);
    let values = curves.iter().flat_map(|c| {
        c.points
            .iter()
            .map(|(_, v)| *v)
            .chain(c.band.iter().flat_map(|(_, lo, hi)| [*lo, *hi]))
    });
    let y = Axis::new(values, HEIGHT - BOTTOM, TOP, false);
    let mut svg = Svg::new(&format!("{name} by step{note}"));
    svg.axes(Some(&x), &y, "step", name);
    let mut legend = Vec::new();
    // Bands fainter as they overlap more.
    let bands = curves.iter().filter(|c| c.band.len() > 1).count();
    let opacity = if bands > 3 { 0.1 } else { 0.18 };
    for c in &curves {
        if c.band.len() > 1 {
            let band = thin(&c.band);
            let upper = band
                .iter()
                .map(|(s, _, hi)| format!("{:.1},{:.1}", x.map(*s as f64), y.map(*hi)));
            let lower = band
                .iter()
                .rev()
                .map(|(s, lo, _)| format!("{:.1},{:.1}", x.map(*s as f64), y.map(*lo)));
            let _ = writeln!(
                svg.body,
                "<polygon class=\"band\" points=\"{}\" fill=\"{}\" fill-opacity=\"{opacity}\" stroke=\"none\"/>",
                upper.chain(lower).collect::<Vec<_>>().join(" "),
                c.colour
            );
        }
    }
    for c in &curves {
        let path: Vec<String> = thin(&c.points)
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(step, v)| format!("{:.1},{:.1}", x.map(*step as f64), y.map(*v)))
            .collect();
        let marker = match path.as_slice() {
            [only] => {
                let (cx, cy) = only.split_once(',').unwrap_or(("0", "0"));
                format!(
                    "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"3\" fill=\"{}\"/>",
                    c.colour
                )
            }
            _ => String::new(),
        };
        let _ = writeln!(
            svg.body,
            "<polyline class=\"curve\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}/>{marker}",
            path.join(" "),
            c.colour,
            if c.dashed { " stroke-dasharray=\"4 3\"" } else { "" }
        );
        legend.push((c.label.clone(), c.colour));
    }
    svg.legend(&legend);
    Some(svg.finish())
}

/// Fewest jobs with a value for the optimization history to be drawn.
const HISTORY_MIN_JOBS: usize = 3;

/// The optimization history: each job's best metric value (as the table's best column) in the
/// order the jobs were numbered (completed jobs filled, pruned and other unfinished ones
/// hollow) and the best completed value so far as a step line. With several sweeps, their jobs
/// follow each other sweep by sweep. `None` for fewer than three jobs with a value
/// (`HISTORY_MIN_JOBS`). Above [`MANY_JOBS`] the points are two paths, without a tooltip each.
pub fn history_svg(report: &Report) -> Option<String> {
    let mut ordered: Vec<&JobRow> = report.jobs.iter().collect();
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
                r.state == JobState::Completed,
            ))
        })
        .collect();
    if points.len() < HISTORY_MIN_JOBS {
        return None;
    }
    let many = points.len() > MANY_JOBS;
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
    let (mut filled, mut hollow) = (String::new(), String::new());
    for (n, v, completed) in &sorted {
        let (px, py) = (x.map(*n as f64), y.map(*v));
        if many {
            if *completed {
                let _ = write!(filled, "M{px:.1} {py:.1}h0");
            } else {
                let _ = write!(
                    hollow,
                    "M{:.1} {py:.1}a3 3 0 1 0 6 0a3 3 0 1 0-6 0",
                    px - 3.0
                );
            }
        } else {
            let fill = if *completed { colour(0) } else { "none" };
            let _ = writeln!(
                svg.body,
                "<circle class=\"trial\" cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3.5\" fill=\"{fill}\" stroke=\"{}\"><title>job {n}: {}</title></circle>",
                colour(0),
                number(*v)
            );
        }
        if !*completed {
            continue;
        }
        // The step line: a corner at each improvement.
        if best.is_none_or(|b| report.mode.better(*v, b)) {
            if let Some(b) = best {
                line.push(format!("{px:.1},{:.1}", y.map(b)));
            }
            best = Some(*v);
            line.push(format!("{px:.1},{py:.1}"));
        }
    }
    if many {
        let _ = writeln!(
            svg.body,
            "<path class=\"trials\" d=\"{filled}\" stroke=\"{}\" stroke-width=\"5\" stroke-linecap=\"round\" stroke-opacity=\"0.6\"/>",
            colour(0)
        );
        if !hollow.is_empty() {
            let _ = writeln!(
                svg.body,
                "<path class=\"trials\" d=\"{hollow}\" fill=\"none\" stroke=\"{}\"/>",
                colour(0)
            );
        }
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

/// One point of a scatter figure: a parameter's value, the metric's (or a mean with its
/// deviation), the tooltip.
struct Mark<'a> {
    x: &'a Value,
    y: f64,
    spread: Option<f64>,
    title: String,
    colour: &'static str,
}

/// The best metric value of each job (or the mean of each configuration, ± its standard
/// deviation) against one parameter.
pub fn param_svg(report: &Report, key: &str) -> Option<String> {
    let (marks, many, title) = match &report.groups {
        Some(groups) => {
            let marks: Vec<Mark> = groups
                .groups
                .iter()
                .filter_map(|g| {
                    Some(Mark {
                        x: g.params.get(key)?,
                        y: g.mean?,
                        spread: g.std,
                        title: format!(
                            "{}: mean {}{}",
                            group_label(g),
                            number(g.mean?),
                            g.std
                                .map(|s| format!(" ± {}", number(s)))
                                .unwrap_or_default()
                        ),
                        colour: colour(0),
                    })
                })
                .collect();
            let title = format!(
                "mean best {} by {key} (± std over {})",
                report.metric,
                groups.by.join(", ")
            );
            (marks, false, title)
        }
        None => {
            let best = report.best.as_ref();
            let marks: Vec<Mark> = report
                .jobs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let is_best = best.is_some_and(|b| b.num == r.num && b.dir == r.dir);
                    Some(Mark {
                        x: r.params.get(key)?,
                        y: r.best.filter(|b| b.is_finite())?,
                        spread: None,
                        title: format!("job {}: {}", r.num, number(r.best?)),
                        colour: if report.jobs.len() > MANY_JOBS {
                            if is_best {
                                colour(1)
                            } else {
                                colour(0)
                            }
                        } else {
                            colour(i)
                        },
                    })
                })
                .collect();
            let many = marks.len() > MANY_JOBS;
            (marks, many, format!("best {} by {key}", report.metric))
        }
    };
    if marks.is_empty() {
        return None;
    }
    let numeric = marks.iter().all(|m| m.x.is_number());
    let categories = distinct(marks.iter().map(|m| param(m.x)));
    let category_index: std::collections::HashMap<&str, usize> = categories
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let xs: Vec<f64> = marks
        .iter()
        .map(|m| {
            if numeric {
                m.x.as_f64().unwrap_or(0.0)
            } else {
                category_index
                    .get(param(m.x).as_str())
                    .copied()
                    .unwrap_or(0) as f64
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
        marks.iter().flat_map(|m| {
            let s = m.spread.unwrap_or(0.0);
            [m.y - s, m.y + s]
        }),
        HEIGHT - BOTTOM,
        TOP,
        false,
    );
    let mut svg = Svg::bare(&title);
    let y_label = if report.groups.is_some() {
        format!("mean best {}", report.metric)
    } else {
        report.metric.clone()
    };
    if numeric {
        svg.axes(
            Some(&x),
            &y,
            &format!("{key}{}", if x.log { " (log)" } else { "" }),
            &y_label,
        );
    } else {
        svg.axes(None, &y, key, &y_label);
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
    if many {
        // One path of round dots: thousands of points in a few bytes each, the best on top.
        let mut dots = String::new();
        let mut on_top = String::new();
        for (m, px) in marks.iter().zip(&xs) {
            let (cx, cy) = (x.map(*px), y.map(m.y));
            if m.colour == colour(0) {
                let _ = write!(dots, "M{cx:.1} {cy:.1}h0");
            } else {
                let _ = write!(
                    on_top,
                    "<circle class=\"point\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"4.5\" fill=\"{}\"><title>best: {}</title></circle>",
                    m.colour,
                    escape(&m.title)
                );
            }
        }
        let _ = writeln!(
            svg.body,
            "<path class=\"points\" d=\"{dots}\" stroke=\"{}\" stroke-width=\"5\" stroke-linecap=\"round\" stroke-opacity=\"0.45\"/>{on_top}",
            colour(0)
        );
        return Some(svg.finish());
    }
    for (m, px) in marks.iter().zip(&xs) {
        let (cx, cy) = (x.map(*px), y.map(m.y));
        if let Some(s) = m.spread {
            let (top, bottom) = (y.map(m.y + s), y.map(m.y - s));
            let _ = writeln!(
                svg.body,
                "<path class=\"spread\" d=\"M{cx:.1} {top:.1}V{bottom:.1}M{:.1} {top:.1}h8M{:.1} {bottom:.1}h8\" stroke=\"{}\" stroke-width=\"1.5\"/>",
                cx - 4.0,
                cx - 4.0,
                m.colour
            );
        }
        let _ = writeln!(
            svg.body,
            "<circle class=\"point\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"4\" fill=\"{}\"><title>{}</title></circle>",
            m.colour,
            escape(&m.title)
        );
    }
    Some(svg.finish())
}

/// The colour of a line in the parallel coordinates: `t` from 0 (the best) to 1 (the worst),
/// dark to light blue.
fn shade(t: f64) -> String {
    let s = (40.0 + t.clamp(0.0, 1.0) * 170.0) as u8;
    format!("rgb({s},{s},230)")
}

/// One line of the parallel coordinates: its parameters, its value, its tooltip (none for
/// most lines of a large sweep).
struct Line<'a> {
    params: &'a IndexMap<String, Value>,
    value: f64,
    title: Option<String>,
}

/// Where a line crosses one axis of the parallel coordinates, in pixels.
type AxisPosition = Box<dyn Fn(&Line) -> f64>;

/// The lines to draw (each job's, or each configuration's mean), the axes' parameters, the
/// metric axis's name and the note under the title.
fn parallel_lines(report: &Report) -> (Vec<Line<'_>>, Vec<String>, String, String) {
    if let Some(groups) = &report.groups {
        let lines = ranked_groups(groups, report.mode)
            .into_iter()
            .map(|g| Line {
                params: &g.params,
                value: g.mean.unwrap_or(f64::NAN),
                title: Some(format!(
                    "{}: mean {}",
                    group_label(g),
                    number(g.mean.unwrap_or(f64::NAN))
                )),
            })
            .collect();
        let note = format!("each configuration's mean over {}", groups.by.join(", "));
        return (
            lines,
            groups.param_keys(),
            format!("mean best {}", report.metric),
            note,
        );
    }
    let ranked = ranked_jobs(report);
    let total = ranked.len();
    let chosen: Vec<usize> = if total <= PARALLEL_LINES {
        ranked
    } else {
        // The best, then an even spread of the rest by rank.
        let rest = &ranked[PARALLEL_BEST..];
        let wanted = PARALLEL_LINES - PARALLEL_BEST;
        let mut chosen = ranked[..PARALLEL_BEST].to_vec();
        chosen.extend((0..wanted).map(|k| rest[k * rest.len() / wanted]));
        chosen
    };
    let note = if total > PARALLEL_LINES {
        format!(
            "{} of {total} jobs: the {PARALLEL_BEST} best and {} spread evenly over the rest",
            chosen.len(),
            chosen.len() - PARALLEL_BEST
        )
    } else {
        String::new()
    };
    let titled = if chosen.len() > MANY_JOBS {
        CURVES_SHOWN
    } else {
        chosen.len()
    };
    let lines = chosen
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let r = &report.jobs[i];
            Line {
                params: &r.params,
                value: r.best.unwrap_or(f64::NAN),
                title: (k < titled)
                    .then(|| format!("job {}: {}", r.num, number(r.best.unwrap_or(f64::NAN)))),
            }
        })
        .collect();
    (
        lines,
        report.param_keys(),
        format!("best {}", report.metric),
        note,
    )
}

/// Parallel coordinates: one axis per parameter and one for the metric, each ticked at its
/// values (a grid's) or at round ones, a log axis marked so; each job (or configuration) a line
/// coloured from best (dark) to worst (light), with a colour bar saying which is which. Labels
/// are drawn over the lines with a white outline, so no line strikes them through.
pub fn parallel_svg(report: &Report) -> Option<String> {
    let (lines, keys, metric_name, note) = parallel_lines(report);
    if keys.is_empty() || lines.is_empty() {
        return None;
    }
    let n_axes = keys.len() + 1;
    // The metric's axis, then room for its labels and the colour bar.
    let last_axis = WIDTH - 150.0;
    let spacing = (last_axis - LEFT) / (n_axes.max(2) - 1) as f64;
    let mut svg = Svg::new(&format!("parameters → {metric_name}"));
    if !note.is_empty() {
        svg.note(&note);
    }
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
        let values: Vec<&Value> = lines.iter().filter_map(|l| l.params.get(key)).collect();
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
            axes.push(Box::new(move |l| {
                axis.map(
                    l.params
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
            axes.push(Box::new(move |l| {
                let s = l.params.get(&key).map(param).unwrap_or_default();
                at(cats.iter().position(|c| *c == s).unwrap_or(0))
            }));
        }
    }
    let metric_axis = Axis::new(lines.iter().map(|l| l.value), y0, y1, false);
    let px = last_axis;
    axis_line(&mut over, px, &metric_name);
    for t in metric_axis.ticks() {
        tick(&mut over, px, metric_axis.map(t), &number(t));
    }
    axes.push(Box::new(move |l| {
        metric_axis.map(if l.value.is_finite() {
            l.value
        } else {
            metric_axis.lo
        })
    }));
    // 0 for the best value, 1 for the worst.
    let (lo, hi) = lines
        .iter()
        .map(|l| l.value)
        .filter(|v| v.is_finite())
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
    let mut ordered: Vec<&Line> = lines.iter().collect();
    ordered.sort_by(|a, b| badness(b.value).total_cmp(&badness(a.value)));
    for l in ordered {
        let points: Vec<String> = axes
            .iter()
            .enumerate()
            .map(|(a, f)| format!("{:.1},{:.1}", LEFT + a as f64 * spacing, f(l)))
            .collect();
        let _ = writeln!(
            svg.body,
            "<polyline class=\"pc\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\">{}</polyline>",
            points.join(" "),
            shade(badness(l.value)),
            l.title
                .as_ref()
                .map(|t| format!("<title>{}</title>", escape(t)))
                .unwrap_or_default()
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
/// `parallel.svg`, `history.svg`).
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
    let keys = match &report.groups {
        Some(groups) => groups.param_keys(),
        None => report.param_keys(),
    };
    for key in keys {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::BestJob;
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
                overrides: IndexMap::new(),
                final_model: None,
            });
        }
        Report {
            metric: "eval_loss".into(),
            mode: Mode::Min,
            groups: None,
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
