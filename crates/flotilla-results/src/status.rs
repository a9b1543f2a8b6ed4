//! `flotilla status` with the sweep's best value so far: the launcher's status (recorded state,
//! directory markers, the scheduler's live view) and, under it, the best value of the report's
//! metric (by default `eval_loss` where any job logged it, else `loss`), read from that metric's
//! series alone, each job's files read once for both.

use crate::report;
use flotilla_contract::layout::METRICS_CSV;
use flotilla_launch::rundir::status::{KnownSteps, RunStatus};
use flotilla_launch::status_text;
use std::path::Path;

/// The status of `dir` and the best value of `metric` so far, each job's `metrics.csv` read
/// once for both (the report's reading gives the status its steps). A directory the report
/// cannot read has its status without a best value.
pub fn status_and_best(
    dir: &Path,
    metric: Option<&str>,
) -> Result<(RunStatus, Option<report::BestSoFar>), flotilla_launch::LaunchError> {
    let options = report::ReportOptions {
        metric: metric.map(str::to_string),
        metric_only: true,
        ..report::ReportOptions::default()
    };
    let built = report::build(&[dir.to_path_buf()], &options).ok();
    // Steps as the markers count them: the last row of `metrics.csv` (none without one).
    let known: Option<KnownSteps> = built.as_ref().map(|r| {
        r.jobs
            .iter()
            .map(|j| {
                let from_csv = j
                    .metrics
                    .source
                    .as_ref()
                    .is_some_and(|s| s.ends_with(METRICS_CSV));
                let steps = from_csv
                    .then(|| j.metrics.last_step().map(|s| s + 1))
                    .flatten();
                (j.dir.clone(), steps)
            })
            .collect()
    });
    let status = flotilla_launch::status_with_steps(dir, known.as_ref())?;
    Ok((status, built.and_then(|r| r.best_so_far())))
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
