//! A job's logged metrics, read from whichever file its program wrote: the built-in trainer's
//! `metrics.csv`, a `metrics.jsonl` (one JSON object per line with a `step`), or TensorBoard
//! event files (`tb/` or the job directory itself), in that order. Every reader tolerates a
//! file still being written (a cut last line or record) and says what it could not read.

use crate::events;
pub use crate::layout::{METRICS_CSV, METRICS_JSONL};
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

/// One metric's values by step, in file order.
pub type Series = Vec<(u64, f64)>;

/// What a job logged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobMetrics {
    /// The file the metrics came from (`None` when the job has none).
    pub source: Option<PathBuf>,
    /// Series by name, in the order the names first appear.
    pub series: IndexMap<String, Series>,
    /// Why some or all of the metrics could not be read.
    pub problem: Option<String>,
}

impl JobMetrics {
    /// The last step logged by any series.
    pub fn last_step(&self) -> Option<u64> {
        self.series
            .values()
            .filter_map(|s| s.last().map(|(step, _)| *step))
            .max()
    }

    pub fn get(&self, name: &str) -> Option<&Series> {
        self.series.get(name).filter(|s| !s.is_empty())
    }
}

/// Reads the metrics of `job_dir` (never fails: problems are reported in the result).
pub fn read_job_metrics(job_dir: &Path) -> JobMetrics {
    read_job_metrics_named(job_dir, None)
}

/// Reads the series of `job_dir` named in `only` (all of them when `None`). A `metrics.csv`
/// cell of any other column is not even parsed: a sweep's best-so-far reads its metric alone.
pub fn read_job_metrics_named(job_dir: &Path, only: Option<&[String]>) -> JobMetrics {
    let csv = job_dir.join(METRICS_CSV);
    if csv.is_file() {
        return read_csv(&csv, only);
    }
    let jsonl = job_dir.join(METRICS_JSONL);
    let mut out = if jsonl.is_file() {
        read_jsonl(&jsonl)
    } else {
        let mut files = events::event_files(&job_dir.join(events::TB_DIR));
        if files.is_empty() {
            files = events::event_files(job_dir);
        }
        if files.is_empty() {
            return JobMetrics {
                problem: Some("no metrics file yet".into()),
                ..JobMetrics::default()
            };
        }
        read_tfevents(&files)
    };
    if let Some(only) = only {
        out.series.retain(|name, _| only.contains(name));
    }
    out
}

fn push(series: &mut IndexMap<String, Series>, name: &str, step: u64, value: f64) {
    series
        .entry(name.to_string())
        .or_default()
        .push((step, value));
}

/// `metrics.csv`: a header with a `step` column; empty cells are skipped; a last line cut
/// short by a writer at work is ignored.
fn read_csv(path: &Path, only: Option<&[String]>) -> JobMetrics {
    let mut out = JobMetrics {
        source: Some(path.to_path_buf()),
        ..JobMetrics::default()
    };
    let text = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => {
            out.problem = Some(format!("cannot read {METRICS_CSV}: {e}"));
            return out;
        }
    };
    if text.iter().all(|b| b.is_ascii_whitespace()) {
        out.problem = Some(format!("{METRICS_CSV} is empty"));
        return out;
    }
    // A last line without its newline may be cut short: keep it only when it parses whole.
    let complete = text.ends_with(b"\n");
    // The trainer's file holds numbers only, never a quote: its lines are split by hand, which
    // on a sweep of thousands of jobs is most of the time a report takes. A file with quotes
    // goes through the CSV reader.
    if let (false, Ok(text)) = (text.contains(&b'"'), std::str::from_utf8(&text)) {
        let mut lines = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| !l.is_empty());
        let Some(header) = lines.next() else {
            out.problem = Some(format!("{METRICS_CSV} is empty"));
            return out;
        };
        let headers: Vec<&str> = header.split(',').map(str::trim).collect();
        let records = lines.map(|l| Some(l.split(',').collect::<Vec<&str>>()));
        csv_series(&mut out, &headers, records, complete, only);
        return out;
    }
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_slice());
    let headers: Vec<String> = match reader.headers() {
        Ok(h) => h.iter().map(|s| s.trim().to_string()).collect(),
        Err(e) => {
            out.problem = Some(format!("{METRICS_CSV}: unreadable header: {e}"));
            return out;
        }
    };
    let rows: Vec<Option<csv::StringRecord>> = reader.records().map(Result::ok).collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let records = rows
        .iter()
        .map(|r| r.as_ref().map(|r| r.iter().collect::<Vec<&str>>()));
    csv_series(&mut out, &headers, records, complete, only);
    out
}

/// The series of a CSV's `records` (`None`: a row the reader could not parse) under
/// `headers`, into `out`.
fn csv_series<'a>(
    out: &mut JobMetrics,
    headers: &[&str],
    records: impl Iterator<Item = Option<Vec<&'a str>>>,
    complete: bool,
    only: Option<&[String]>,
) {
    let Some(step_col) = headers.iter().position(|h| *h == "step") else {
        out.problem = Some(format!("{METRICS_CSV} has no 'step' column"));
        return;
    };
    let wanted = |name: &str| only.is_none_or(|only| only.iter().any(|o| o == name));
    for name in headers.iter().filter(|h| **h != "step" && wanted(h)) {
        out.series.insert(name.to_string(), Vec::new());
    }
    // Each column's series, by its index in `out.series` (found once, not per cell).
    let series_of: Vec<Option<usize>> = headers
        .iter()
        .enumerate()
        .map(|(col, name)| {
            (col != step_col)
                .then(|| out.series.get_index_of(*name))
                .flatten()
        })
        .collect();
    let mut records = records.enumerate().peekable();
    while let Some((i, record)) = records.next() {
        let Some(record) = record else {
            out.problem = Some(format!("{METRICS_CSV}: row {} is malformed", i + 2));
            continue;
        };
        let last_and_cut = records.peek().is_none() && !complete;
        if last_and_cut && record.len() != headers.len() {
            out.problem = Some(format!("{METRICS_CSV}: its last row is cut short"));
            break;
        }
        let Some(step) = record
            .get(step_col)
            .and_then(|s| s.trim().parse::<u64>().ok())
        else {
            out.problem = Some(format!("{METRICS_CSV}: row {} has no step", i + 2));
            continue;
        };
        for (col, cell) in record.iter().enumerate() {
            let Some(&Some(index)) = series_of.get(col) else {
                continue;
            };
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            match parse_number(cell) {
                Some(v) => out.series[index].push((step, v)),
                None if last_and_cut => {
                    out.problem = Some(format!("{METRICS_CSV}: its last row is cut short"));
                }
                None => {}
            }
        }
    }
    out.series.retain(|_, s| !s.is_empty());
}

/// A number as Python, pandas or Rust print it (`nan`, `NaN`, `inf`, `-Infinity`, ...).
fn parse_number(cell: &str) -> Option<f64> {
    if let Ok(v) = cell.parse() {
        return Some(v);
    }
    match cell.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "infinity" | "+inf" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// `metrics.jsonl`: one object per line with an integer `step` and numeric fields.
fn read_jsonl(path: &Path) -> JobMetrics {
    let mut out = JobMetrics {
        source: Some(path.to_path_buf()),
        ..JobMetrics::default()
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            out.problem = Some(format!("cannot read {METRICS_JSONL}: {e}"));
            return out;
        }
    };
    if text.trim().is_empty() {
        out.problem = Some(format!("{METRICS_JSONL} is empty"));
        return out;
    }
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let object = match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(o)) => o,
            _ if i + 1 == lines.len() && !text.ends_with('\n') => {
                out.problem = Some(format!("{METRICS_JSONL}: its last line is cut short"));
                break;
            }
            _ => {
                out.problem = Some(format!(
                    "{METRICS_JSONL}: line {} is not a JSON object",
                    i + 1
                ));
                continue;
            }
        };
        let Some(step) = object.get("step").and_then(serde_json::Value::as_u64) else {
            out.problem = Some(format!("{METRICS_JSONL}: line {} has no step", i + 1));
            continue;
        };
        for (name, value) in &object {
            let number = match value {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => parse_number(s),
                _ => None,
            };
            if let (Some(v), true) = (number, name != "step") {
                push(&mut out.series, name, step, v);
            }
        }
    }
    out
}

/// TensorBoard event files, oldest first; negative steps are skipped.
fn read_tfevents(files: &[PathBuf]) -> JobMetrics {
    let mut out = JobMetrics {
        source: files.last().cloned(),
        ..JobMetrics::default()
    };
    for file in files {
        match events::read_event_file(file) {
            Ok(events) => {
                for s in events.scalars {
                    if let Ok(step) = u64::try_from(s.step) {
                        push(&mut out.series, &s.tag, step, s.value);
                    }
                }
                if let Some(why) = events.stopped {
                    out.problem = Some(format!("{}: {why}", file.display()));
                }
            }
            Err(e) => out.problem = Some(e.to_string()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv_text(text: &str) -> JobMetrics {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_CSV), text).unwrap();
        read_job_metrics(dir.path())
    }

    #[test]
    fn csv_with_sparse_eval_columns() {
        let m = csv_text("step,loss,eval_loss\n0,2.5,\n1,2.0,2.2\n2,1.5,\n");
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 2.5), (1, 2.0), (2, 1.5)]);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        assert_eq!(m.last_step(), Some(2));
        assert_eq!(m.problem, None);
    }

    #[test]
    fn csv_cut_short_keeps_complete_rows() {
        let m = csv_text("step,loss,eval_loss\n0,2.5,\n1,2.");
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 2.5)]);
        assert!(m.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn csv_with_nan_and_empty_files() {
        let m = csv_text("step,loss\n0,2.5\n1,nan\n");
        assert!(m.get("loss").unwrap()[1].1.is_nan());
        assert!(csv_text("").problem.unwrap().contains("empty"));
        assert!(csv_text("a,b\n1,2\n")
            .problem
            .unwrap()
            .contains("no 'step'"));
    }

    #[test]
    fn quoted_and_plain_files_read_the_same() {
        let plain = "step,loss,eval_loss\r\n0,2.5,\r\n\r\n1,2.0,2.2\r\n2,1.5,\r\n";
        let quoted = "\"step\",loss,\"eval_loss\"\n0,2.5,\n1,\"2.0\",2.2\n2,1.5,\n";
        let (a, b) = (csv_text(plain), csv_text(quoted));
        assert_eq!(a.series, b.series);
        assert_eq!(a.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        assert_eq!((a.problem, b.problem), (None, None));
        let cut = csv_text("step,loss,eval_loss\n0,2.5,\n1,\"2.");
        assert_eq!(cut.get("loss").unwrap(), &vec![(0, 2.5)]);
        assert!(cut.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn jsonl_metrics() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"loss\": 3.0}\n{\"step\": 5, \"loss\": 2.0, \"acc\": 0.5}\n{\"step\": 6",
        )
        .unwrap();
        let m = read_job_metrics(dir.path());
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 3.0), (5, 2.0)]);
        assert_eq!(m.get("acc").unwrap(), &vec![(5, 0.5)]);
        assert!(m.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn only_the_named_series_are_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_CSV),
            "step,loss,lr,eval_loss\n0,2.5,0.1,\n1,2.0,0.1,2.2\n2,Infinity,x,\n",
        )
        .unwrap();
        let only = ["eval_loss".to_string(), "loss".to_string()];
        let m = read_job_metrics_named(dir.path(), Some(&only));
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["loss", "eval_loss"]);
        assert_eq!(m.get("loss").unwrap()[..2], [(0, 2.5), (1, 2.0)]);
        assert_eq!(m.get("loss").unwrap()[2].1, f64::INFINITY);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        let all = read_job_metrics(dir.path());
        assert_eq!(all.get("lr").unwrap(), &vec![(0, 0.1), (1, 0.1)]);
        std::fs::remove_file(dir.path().join(METRICS_CSV)).unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"loss\": 3.0, \"acc\": 0.5}\n",
        )
        .unwrap();
        let m = read_job_metrics_named(dir.path(), Some(&only));
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["loss"]);
    }

    #[test]
    fn no_metrics_is_a_problem_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let m = read_job_metrics(dir.path());
        assert!(m.series.is_empty());
        assert_eq!(m.problem.as_deref(), Some("no metrics file yet"));
    }
}
