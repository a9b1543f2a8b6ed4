//! `flotilla status` with the sweep's best value so far: the launcher's status (recorded state,
//! directory markers, the scheduler's live view) and, under it, the best value of the report's
//! metric (by default `eval_loss` where any job logged it, else `loss`), read from that metric's
//! series alone, each job's files read once for both.

use crate::report::{self, discover};
use flotilla_config::schema::Launcher;
use flotilla_contract::layout::METRICS_CSV;
use flotilla_launch::rundir::status::{locate, KnownMarkers, Markers, RunStatus};
use flotilla_launch::status_text;
use std::path::Path;

/// The status of `dir` and the best value of `metric` so far, each job's files read once for
/// both (the report's reading gives the status its steps and `final/` markers), and the plan of
/// a sweep or run directory run by this machine's launcher parsed once. A directory the report
/// cannot read has its status without a best value.
pub fn status_and_best(
    dir: &Path,
    metric: Option<&str>,
) -> Result<(RunStatus, Option<report::BestSoFar>), flotilla_launch::LaunchError> {
    let options = report::ReportOptions {
        metric: metric.map(str::to_string),
        metric_only: true,
        final_models: true,
        ..report::ReportOptions::default()
    };
    let located = locate(dir)?;
    let plan = match (&located.plan, located.only) {
        (Some(plan_file), None) => Some(plan_file.read()?),
        _ => None,
    };
    let built = match (&located.plan, &plan) {
        // The report of the plan's jobs, as `report DIR` would find them.
        (Some(plan_file), Some(plan)) if plan.launcher == Launcher::Local => {
            let found = discover::jobs_of_plan(dir, plan_file, plan.clone());
            (!found.is_empty())
                .then(|| report::build_of_jobs(found, &options).ok())
                .flatten()
        }
        _ => report::build(&[dir.to_path_buf()], &options).ok(),
    };
    // Steps as the markers count them: the last row of `metrics.csv` (none without one).
    let known: Option<KnownMarkers> = built.as_ref().map(|r| {
        r.jobs
            .iter()
            .filter_map(|j| {
                let from_csv = j
                    .metrics
                    .source
                    .as_ref()
                    .is_some_and(|s| s.ends_with(METRICS_CSV));
                let steps = from_csv
                    .then(|| j.metrics.last_step().map(|s| s + 1))
                    .flatten();
                let markers = Markers {
                    steps,
                    final_model: j.final_model?,
                };
                Some((j.dir.clone(), markers))
            })
            .collect()
    });
    let plan = match (located.only, plan) {
        // One job of a sweep: the status reads the sweep's plan.
        (Some(_), _) => located.plan.as_ref().map(|p| p.read()).transpose()?,
        (None, plan) => plan,
    };
    let status = flotilla_launch::status_of_located(dir, located, plan, known.as_ref())?;
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
