//! A report as text: an aligned table for the terminal, CSV, JSON (the documented shape) and
//! Markdown.

use super::{param_header, JobRow, Report};

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
    let rows = report
        .jobs
        .iter()
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

/// An aligned table (numbers right-aligned), with a line naming the best job.
pub fn table(report: &Report) -> String {
    let (header, rows) = cells(report);
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let last = header.len() - 1;
    let state_col = header.iter().position(|h| h == "state").unwrap_or(1);
    let numeric = |col: usize| {
        col != state_col
            && col != last
            && rows.iter().all(|r| {
                let c = r[col].trim_end_matches('*');
                c.is_empty() || c.parse::<f64>().is_ok() || c == "nan" || c == "inf"
            })
    };
    let line = |cols: &[String]| -> String {
        let mut out = String::new();
        for (i, c) in cols.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i] - c.chars().count();
            if i == last {
                out.push_str(c);
            } else if numeric(i) {
                out.push_str(&" ".repeat(pad));
                out.push_str(c);
            } else {
                out.push_str(c);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(&header);
    for row in &rows {
        out.push_str(&line(row));
    }
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

/// CSV with the table's columns (numbers unrounded).
pub fn csv(report: &Report) -> Result<String, csv::Error> {
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
        row.extend(keys.iter().map(|k| match r.params.get(k) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Null) | None => String::new(),
            Some(v) => v.to_string(),
        }));
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

/// A Markdown table.
pub fn markdown(report: &Report) -> String {
    let (header, rows) = cells(report);
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
