//! A report as text: an aligned table for the terminal, CSV, JSON (the documented shape) and
//! Markdown.

use super::group::{Group, Groups};
use super::{param_header, JobRow, Mode, Report};
use rayon::prelude::*;

pub use flotilla_contract::metrics::format_value as number;

fn opt(x: Option<f64>) -> String {
    x.map(number).unwrap_or_default()
}

/// A parameter value as written in an override.
pub fn param(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        serde_json::Value::Number(n) => n.as_f64().map_or_else(
            || n.to_string(),
            |f| {
                if n.is_f64() {
                    number(f)
                } else {
                    n.to_string()
                }
            },
        ),
        other => other.to_string(),
    }
}

/// Header and cells of every row, in display order.
fn cells(report: &Report) -> (Vec<String>, Vec<Vec<String>>) {
    let keys = report.param_keys();
    let sweeps = report.spans_sweeps();
    let mut header = vec!["num".to_string()];
    if sweeps {
        header.push("sweep".into());
    }
    header.push("state".into());
    header.extend(keys.iter().map(|k| param_header(k)));
    header.extend([
        format!("final {}", report.metric),
        report.best_header(),
        "best_step".into(),
        "steps".into(),
        "wall_s".into(),
        "tokens/s".into(),
        "note".into(),
    ]);
    // Each row's numbers formatted on every core: a sweep has thousands of rows.
    let rows = report
        .jobs
        .par_iter()
        .map(|r: &JobRow| {
            let mut row = vec![if report.is_best(r) {
                format!("{}*", r.num)
            } else {
                r.num.to_string()
            }];
            if sweeps {
                row.push(r.sweep.clone().unwrap_or_default());
            }
            row.push(r.state.to_string());
            row.extend(
                keys.iter()
                    .map(|k| r.params.get(k).map(param).unwrap_or_default()),
            );
            row.extend([
                opt(r.final_value),
                opt(r.best),
                r.best_step.map(|s| s.to_string()).unwrap_or_default(),
                r.steps.to_string(),
                opt(r.wall_s),
                r.tokens_per_s
                    .map(|t| format!("{t:.0}"))
                    .unwrap_or_default(),
                r.reason.clone().unwrap_or_default(),
            ]);
            row
        })
        .collect();
    (header, rows)
}

/// Aligned columns (numbers right-aligned; the last column, a note, and `text_col` left
/// as they are), one line per row under the header.
fn aligned(header: &[String], rows: &[Vec<String>], text_col: Option<usize>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let last = header.len() - 1;
    // Decided once per column, not per cell: a sweep has thousands of rows.
    let numeric: Vec<bool> = (0..header.len())
        .map(|col| {
            Some(col) != text_col
                && col != last
                && rows.iter().all(|r| {
                    let c = r[col].trim_end_matches('*');
                    c.is_empty() || c.parse::<f64>().is_ok() || c == "nan" || c == "inf"
                })
        })
        .collect();
    let line = |cols: &[String], out: &mut String| {
        let start = out.len();
        for (i, c) in cols.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i] - c.chars().count();
            if i == last {
                out.push_str(c);
            } else if numeric[i] {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(c);
            } else {
                out.push_str(c);
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let kept = out[start..].trim_end().len();
        out.truncate(start + kept);
        out.push('\n');
    };
    let mut out =
        String::with_capacity((widths.iter().sum::<usize>() + 2 * widths.len()) * (rows.len() + 1));
    line(header, &mut out);
    for row in rows {
        line(row, &mut out);
    }
    out
}

/// An aligned table (numbers right-aligned), with a line naming the best job.
pub fn table(report: &Report) -> String {
    if let Some(groups) = &report.groups {
        return group_table(report, groups);
    }
    let (header, rows) = cells(report);
    let state_col = header.iter().position(|h| h == "state").unwrap_or(1);
    let mut out = aligned(&header, &rows, Some(state_col));
    match &report.best {
        Some(b) => out.push_str(&format!(
            "best {} ({}): job {} in {} (marked *)\n",
            report.metric,
            match report.mode {
                super::Mode::Min => "the lowest value logged at any step",
                super::Mode::Max => "the highest value logged at any step",
            },
            b.num,
            b.dir.display()
        )),
        None => out.push_str(&format!("no job has logged {} yet\n", report.metric)),
    }
    out
}

/// Most values of a grouped key a cell lists one by one.
const LISTED_VALUES: usize = 6;

/// A grouped key's values in a cell: all of them when few, else the first two, the last and
/// the count.
pub fn grouped_cell(values: &[serde_json::Value]) -> String {
    let texts: Vec<String> = values.iter().map(param).collect();
    if texts.len() <= LISTED_VALUES {
        texts.join(",")
    } else {
        format!(
            "{},{},…,{} ({})",
            texts[0],
            texts[1],
            texts[texts.len() - 1],
            texts.len()
        )
    }
}

/// The header of a grouped report's mean column: `mean best eval_loss`.
pub fn mean_header(report: &Report) -> String {
    format!("mean best {}", report.metric)
}

/// Header and cells of every configuration, in display order; the best one's mean starred.
fn group_cells(report: &Report, groups: &Groups) -> (Vec<String>, Vec<Vec<String>>) {
    let keys = groups.param_keys();
    let mut header: Vec<String> = keys.iter().map(|k| param_header(k)).collect();
    header.extend(groups.by.iter().cloned());
    header.extend([
        "n".to_string(),
        mean_header(report),
        "std".into(),
        format!("final {} mean", report.metric),
        "final std".into(),
        "jobs".into(),
        "note".into(),
    ]);
    let rows = groups
        .groups
        .iter()
        .map(|g: &Group| {
            let mut row: Vec<String> = keys
                .iter()
                .map(|k| g.params.get(k).map(param).unwrap_or_default())
                .collect();
            row.extend(g.grouped.values().map(|v| grouped_cell(v)));
            let mean = opt(g.mean);
            row.extend([
                g.n.to_string(),
                if groups.is_best(g, report.mode) {
                    format!("{mean}*")
                } else {
                    mean
                },
                opt(g.std),
                opt(g.final_mean),
                opt(g.final_std),
                grouped_cell(
                    &g.jobs
                        .iter()
                        .map(|n| serde_json::Value::from(*n))
                        .collect::<Vec<_>>(),
                ),
                g.reason.clone().unwrap_or_default(),
            ]);
            row
        })
        .collect();
    (header, rows)
}

/// The line under a grouped table: the best configuration and what the columns mean.
fn group_footer(report: &Report, groups: &Groups) -> String {
    let what = format!(
        "each row: the jobs that differ only in {}; mean and std (sample standard deviation, \
         n - 1) of their best {} ({} value at any step) over the n jobs that logged one\n",
        groups.by.join(", "),
        report.metric,
        match report.mode {
            Mode::Min => "lowest",
            Mode::Max => "highest",
        }
    );
    match groups.best(report.mode) {
        Some(g) => {
            let config: Vec<String> = g
                .params
                .iter()
                .map(|(k, v)| format!("{k}={}", param(v)))
                .collect();
            format!(
                "{what}best configuration (marked *): {} (mean {}{}, n {})\n",
                if config.is_empty() {
                    "all jobs".to_string()
                } else {
                    config.join(" ")
                },
                opt(g.mean),
                g.std
                    .map(|s| format!(" ± {}", number(s)))
                    .unwrap_or_default(),
                g.n
            )
        }
        None => format!("{what}no job has logged {} yet\n", report.metric),
    }
}

/// A grouped report as an aligned table.
fn group_table(report: &Report, groups: &Groups) -> String {
    let (header, rows) = group_cells(report, groups);
    let mut out = aligned(&header, &rows, None);
    out.push_str(&group_footer(report, groups));
    out
}

/// A grouped report as CSV (numbers unrounded, a grouped key's values and the jobs joined by
/// `;`).
fn group_csv(groups: &Groups) -> Result<String, csv::Error> {
    let keys = groups.param_keys();
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = keys.iter().map(|k| param_header(k)).collect();
    header.extend(groups.by.iter().cloned());
    header.extend(
        [
            "n",
            "mean",
            "std",
            "final_mean",
            "final_std",
            "jobs",
            "reason",
        ]
        .map(String::from),
    );
    w.write_record(&header)?;
    let raw = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    for g in &groups.groups {
        let mut row: Vec<String> = keys.iter().map(|k| csv_value(g.params.get(k))).collect();
        row.extend(g.grouped.values().map(|vs| {
            vs.iter()
                .map(|v| csv_value(Some(v)))
                .collect::<Vec<_>>()
                .join(";")
        }));
        row.extend([
            g.n.to_string(),
            raw(g.mean),
            raw(g.std),
            raw(g.final_mean),
            raw(g.final_std),
            g.jobs
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(";"),
            g.reason.clone().unwrap_or_default(),
        ]);
        w.write_record(&row)?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A parameter value in a CSV cell: text as it is, numbers unrounded.
fn csv_value(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

/// CSV with the table's columns (numbers unrounded).
pub fn csv(report: &Report) -> Result<String, csv::Error> {
    if let Some(groups) = &report.groups {
        return group_csv(groups);
    }
    let keys = report.param_keys();
    let mut w = csv::Writer::from_writer(Vec::new());
    let sweeps = report.spans_sweeps();
    let mut header = vec!["num".to_string()];
    if sweeps {
        header.push("sweep".into());
    }
    header.extend(["dir".to_string(), "state".into()]);
    header.extend(keys.iter().map(|k| param_header(k)));
    header.extend(
        [
            "final",
            "best",
            "best_step",
            "steps",
            "wall_s",
            "tokens_per_s",
            "reason",
        ]
        .map(String::from),
    );
    w.write_record(&header)?;
    let raw = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    for r in &report.jobs {
        let mut row = vec![r.num.to_string()];
        if sweeps {
            row.push(r.sweep.clone().unwrap_or_default());
        }
        row.extend([r.dir.display().to_string(), r.state.to_string()]);
        row.extend(keys.iter().map(|k| csv_value(r.params.get(k))));
        row.extend([
            raw(r.final_value),
            raw(r.best),
            r.best_step.map(|s| s.to_string()).unwrap_or_default(),
            r.steps.to_string(),
            raw(r.wall_s),
            raw(r.tokens_per_s),
            r.reason.clone().unwrap_or_default(),
        ]);
        w.write_record(&row)?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The JSON document (`{"metric", "mode", "jobs": [...], "best"}`); non-finite numbers are
/// null (serde_json writes them so).
pub fn json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_default();
    text.push('\n');
    text
}

/// A Markdown table (of the configurations, when grouped, with the line that says what the
/// columns mean under it).
pub fn markdown(report: &Report) -> String {
    let (header, rows) = match &report.groups {
        Some(groups) => group_cells(report, groups),
        None => cells(report),
    };
    let escape = |c: &str| c.replace('|', "\\|");
    let mut out = format!(
        "| {} |\n|{}|\n",
        header
            .iter()
            .map(|h| escape(h))
            .collect::<Vec<_>>()
            .join(" | "),
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    );
    for row in rows {
        out.push_str(&format!(
            "| {} |\n",
            row.iter()
                .map(|c| escape(c))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    if let Some(groups) = &report.groups {
        out.push('\n');
        out.push_str(&group_footer(report, groups));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.12345), "0.1235");
        assert_eq!(number(3e-4), "3e-4");
        assert_eq!(number(-1.5e-7), "-1.5e-7");
        assert_eq!(number(123456.0), "1.235e5");
        assert_eq!(number(f64::NAN), "nan");
        assert_eq!(number(0.0), "0");
    }
}
