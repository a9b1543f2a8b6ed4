//! `flotilla status` with the sweep's best value so far: the launcher's status (recorded state,
//! directory markers, the scheduler's live view) and, under it, the best value of the report's
//! metric, read from that metric's series alone.

use crate::report;
use flotilla_launch::rundir::status::RunStatus;
use flotilla_launch::status_text;
use std::path::Path;

/// The best value of `metric` logged so far by the jobs of `dir` (by default the report's
/// metric: `eval_loss` where any job logged it, else `loss`), with the report's mode; `None`
/// while no job has logged it.
pub fn status_best(
    dir: &Path,
    metric: Option<&str>,
) -> Result<Option<report::BestSoFar>, report::ReportError> {
    let options = report::ReportOptions {
        metric: metric.map(str::to_string),
        metric_only: true,
        ..report::ReportOptions::default()
    };
    Ok(report::build(&[dir.to_path_buf()], &options)?.best_so_far())
}

/// [`status_text`] with the best-so-far line under the table when there is one.
pub fn status_text_with_best(st: &RunStatus, best: Option<&report::BestSoFar>) -> String {
    let mut out = status_text(st);
    if let Some(b) = best {
        out.push_str(&b.line());
        out.push('\n');
    }
    out
}

/// [`status_json`](flotilla_launch::status_json) with `"best": {"metric", "mode", "value", "num", "step", "params"}` (or
/// `null`) after the jobs.
pub fn status_json_with_best(st: &RunStatus, best: Option<&report::BestSoFar>) -> String {
    #[derive(serde::Serialize)]
    struct WithBest<'a> {
        #[serde(flatten)]
        status: &'a RunStatus,
        best: Option<&'a report::BestSoFar>,
    }
    let mut s = serde_json::to_string(&WithBest { status: st, best }).expect("status serialises");
    s.push('\n');
    s
}
