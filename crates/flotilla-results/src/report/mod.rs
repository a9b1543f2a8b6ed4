//! `flotilla report`: one row per job of the run and sweep directories given — its state (with
//! the reason of a failure), the parameters that differ across the jobs, the chosen metric's
//! final and best values and the step of the best, steps done, wall time and throughput — as a
//! table, CSV, JSON, Markdown, a self-contained HTML page with plots, or the plots as SVG and PNG
//! files. Reading only: the report never writes into a run directory, and a broken job (no
//! metrics, a cut or NaN-holding file, no config, an unreadable plan) gets its row with the
//! reason instead of stopping the report.

pub mod discover;
pub mod html;
pub mod legend;
pub mod png;
pub mod render;

use discover::FoundJob;
use flotilla_config::node::Node;
use flotilla_contract::metrics::{read_job_metrics_named, JobMetrics};
use flotilla_launch::rundir::status::{combine, has_final_model, Markers};
use flotilla_launch::rundir::{
    load_job_config_tree, override_assignments, read_overrides, JobState, CONFIG_FILE,
};
use indexmap::IndexMap;
use serde::Serialize;
use std::cmp::Ordering;
use std::path::PathBuf;

pub use flotilla_contract::metrics::Mode;

/// What to report.
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    /// The metric (default: `eval_loss` when any job logged it, else `loss`).
    pub metric: Option<String>,
    pub mode: Option<Mode>,
    /// A column to sort by (`num`, `state`, `final`, `best`, `best_step`, `steps`, `wall_s`,
    /// `tokens_per_s` or a parameter key); metric columns sort best first.
    pub sort: Option<String>,
    /// Keep the K best rows (by `sort`, or by the best metric value).
    pub top: Option<usize>,
    /// Read only the metric's series (and `eval_loss` and `loss`, to choose the default
    /// metric): enough for the best values, not for the figures, the wall time or the
    /// throughput. What `flotilla status` asks for, to stay cheap on a large sweep.
    pub metric_only: bool,
}

/// One job's row.
#[derive(Clone, Debug, Serialize)]
pub struct JobRow {
    pub num: usize,
    pub dir: PathBuf,
    /// The sweep (or single run) the job belongs to, as the report names it: set only when the
    /// report spans several, each named by its path without the part they all share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<String>,
    pub state: JobState,
    /// The parameters that differ across the jobs, by key.
    pub params: IndexMap<String, serde_json::Value>,
    /// The metric's last logged value.
    #[serde(rename = "final")]
    pub final_value: Option<f64>,
    /// The metric's best logged value over all steps (the lowest for a `min` metric, the
    /// highest for a `max` one): what "best" means everywhere in the report.
    pub best: Option<f64>,
    pub best_step: Option<u64>,
    /// Steps done (the last logged step + 1).
    pub steps: u64,
    pub wall_s: Option<f64>,
    /// Median tokens per second over the logged steps.
    pub tokens_per_s: Option<f64>,
    /// Why the row is incomplete or the job failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip)]
    pub metrics: JobMetrics,
}

/// The best job.
#[derive(Clone, Debug, Serialize)]
pub struct BestJob {
    pub num: usize,
    pub dir: PathBuf,
}

/// A report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub metric: String,
    pub mode: Mode,
    pub jobs: Vec<JobRow>,
    pub best: Option<BestJob>,
}

/// The best value of the report's metric logged so far, and where: what `flotilla status`
/// shows under its table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BestSoFar {
    pub metric: String,
    pub mode: Mode,
    pub value: f64,
    /// The job's number.
    pub num: usize,
    /// The step the value was logged at.
    pub step: u64,
    /// The job's parameters that differ across the jobs.
    pub params: IndexMap<String, serde_json::Value>,
}

impl BestSoFar {
    /// `best eval_loss so far: 2.3145 (job 3, step 400; trainer.lr=0.003)`.
    pub fn line(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", render::param(v)))
            .collect();
        format!(
            "best {} so far: {} (job {}, step {}{}{})",
            self.metric,
            render::number(self.value),
            self.num,
            self.step,
            if params.is_empty() { "" } else { "; " },
            params.join(" ")
        )
    }
}

impl Report {
    /// The best job's best value with its step and parameters; `None` while no job has logged
    /// a finite value of the metric.
    pub fn best_so_far(&self) -> Option<BestSoFar> {
        let best = self.best.as_ref()?;
        let row = self
            .jobs
            .iter()
            .find(|r| r.num == best.num && r.dir == best.dir)?;
        Some(BestSoFar {
            metric: self.metric.clone(),
            mode: self.mode,
            value: row.best?,
            num: row.num,
            step: row.best_step?,
            params: row.params.clone(),
        })
    }

    /// Whether `row` is the best job (its number alone is not enough: several sweeps each have
    /// a job of that number).
    pub fn is_best(&self, row: &JobRow) -> bool {
        self.best
            .as_ref()
            .is_some_and(|b| b.num == row.num && b.dir == row.dir)
    }

    /// The header of the best-value column: `best eval_loss (min over steps)`.
    pub fn best_header(&self) -> String {
        format!(
            "best {} ({} over steps)",
            self.metric,
            match self.mode {
                Mode::Min => "min",
                Mode::Max => "max",
            }
        )
    }

    /// Whether the jobs come from several sweeps or runs (a `sweep` column tells them apart).
    pub fn spans_sweeps(&self) -> bool {
        self.jobs.iter().any(|r| r.sweep.is_some())
    }

    /// The parameter columns, in the order of the first job's parameters.
    pub fn param_keys(&self) -> Vec<String> {
        self.jobs
            .first()
            .map(|r| r.params.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The report's own column names; a parameter of the same name is shown as `NAME (config)`.
pub const FIXED_COLUMNS: [&str; 12] = [
    "num",
    "sweep",
    "dir",
    "state",
    "final",
    "best",
    "best_step",
    "steps",
    "wall_s",
    "tokens_per_s",
    "tokens/s",
    "note",
];

/// The column header of a parameter: its key, unless the report has a column of that name.
pub fn param_header(key: &str) -> String {
    if FIXED_COLUMNS.contains(&key) || key == "reason" {
        format!("{key} (config)")
    } else {
        key.to_string()
    }
}

/// Names each job's sweep (or single run) when the jobs come from more than one: the paths
/// without their shared leading components (`outputs/multirun/2026-11-25/10-00-00` and
/// `.../11-00-00` become `10-00-00` and `11-00-00`).
fn sweep_labels(groups: &[PathBuf]) -> Vec<Option<String>> {
    let mut distinct: Vec<&PathBuf> = Vec::new();
    for g in groups {
        if !distinct.contains(&g) {
            distinct.push(g);
        }
    }
    if distinct.len() < 2 {
        return vec![None; groups.len()];
    }
    let parts: Vec<Vec<String>> = distinct
        .iter()
        .map(|p| {
            p.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .collect();
    let shortest = parts.iter().map(Vec::len).min().unwrap_or(0);
    let mut shared = 0;
    while shared + 1 < shortest && parts.iter().all(|p| p[shared] == parts[0][shared]) {
        shared += 1;
    }
    groups
        .iter()
        .map(|g| {
            let i = distinct.iter().position(|d| *d == g).expect("listed");
            Some(parts[i][shared..].join("/"))
        })
        .collect()
}

/// Errors that stop a report: only a path that does not exist, or a sort key no column has.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    Path(String),
    #[error("no job under {}: no sweep.json, job.json or meta.json was found (give a run dir or a sweep dir)", .0.display())]
    NoJobs(PathBuf),
    #[error("unknown sort key '{key}'; sort by one of: {choices}")]
    SortKey { key: String, choices: String },
    #[error("no job logged a metric named '{metric}'{hint}; the metrics logged are: {available} (pass one of them to --metric)")]
    UnknownMetric {
        metric: String,
        /// ` (did you mean 'eval_loss'?)`, or empty.
        hint: String,
        available: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Builds the report of the jobs under `paths`.
pub fn build(paths: &[PathBuf], options: &ReportOptions) -> Result<Report, ReportError> {
    let found = discover::find_jobs(paths).map_err(ReportError::Path)?;
    if found.is_empty() {
        return Err(ReportError::NoJobs(paths[0].clone()));
    }
    let only: Option<Vec<String>> = options.metric_only.then(|| match &options.metric {
        Some(m) => vec![m.clone()],
        None => vec!["eval_loss".into(), "loss".into()],
    });
    let jobs: Vec<(FoundJob, JobMetrics, Option<Node>)> = found
        .into_iter()
        .map(|job| {
            let metrics = read_job_metrics_named(&job.dir, only.as_deref());
            let config = load_job_config_tree(&job.dir);
            (job, metrics, config)
        })
        .collect();
    let metric = options.metric.clone().unwrap_or_else(|| {
        if jobs.iter().any(|(_, m, _)| m.get("eval_loss").is_some()) {
            "eval_loss".into()
        } else {
            "loss".into()
        }
    });
    let mode = options.mode.unwrap_or_else(|| Mode::for_metric(&metric));
    let params = differing_params(&jobs);
    let groups: Vec<PathBuf> = jobs
        .iter()
        .map(|(job, _, _)| job.sweep_dir.clone().unwrap_or_else(|| job.dir.clone()))
        .collect();
    let mut rows: Vec<JobRow> = jobs
        .into_iter()
        .zip(params)
        .zip(sweep_labels(&groups))
        .map(|(((job, metrics, config), params), sweep)| {
            let mut row = row(job, metrics, config.is_some(), params, &metric, mode);
            row.sweep = sweep;
            row
        })
        .collect();
    if !options.metric_only {
        check_metric_exists(&rows, &metric)?;
    }
    let best = rows
        .iter()
        .filter_map(|r| r.best.filter(|b| b.is_finite()).map(|b| (b, r)))
        .fold(None::<(f64, &JobRow)>, |acc, (b, r)| match acc {
            Some((a, _)) if !mode.better(b, a) => acc,
            _ => Some((b, r)),
        })
        .map(|(_, r)| BestJob {
            num: r.num,
            dir: r.dir.clone(),
        });
    sort_rows(&mut rows, options, mode)?;
    if let Some(k) = options.top {
        rows.truncate(k);
    }
    Ok(Report {
        metric,
        mode,
        jobs: rows,
        best,
    })
}

/// Refuses a metric no job has logged when it is surely not coming: its name is a near miss of
/// one that was logged (a typo), or a job has already ended with metrics but without it. While
/// every job is still running, a metric not logged yet (the first evaluation) is not an error:
/// the rows say "no 'x' logged yet".
fn check_metric_exists(rows: &[JobRow], metric: &str) -> Result<(), ReportError> {
    if rows.iter().any(|r| r.metrics.get(metric).is_some()) {
        return Ok(());
    }
    let mut available: Vec<&str> = Vec::new();
    for r in rows {
        for name in r.metrics.series.keys() {
            if !available.contains(&name.as_str()) {
                available.push(name);
            }
        }
    }
    if available.is_empty() {
        return Ok(());
    }
    let near = flotilla_config::near_miss(metric, available.iter().copied());
    let ended = rows
        .iter()
        .any(|r| r.state.is_terminal() && !r.metrics.series.is_empty());
    if near.is_none() && !ended {
        return Ok(());
    }
    Err(ReportError::UnknownMetric {
        metric: metric.to_string(),
        hint: near
            .map(|n| format!(" (did you mean '{n}'?)"))
            .unwrap_or_default(),
        available: available.join(", "),
    })
}

/// The task overrides of a job without a readable config (`overrides.yaml`, or its plan
/// record), as `key → value`; a value is typed as JSON reads it, else kept as text.
fn override_params(job: &FoundJob) -> IndexMap<String, serde_json::Value> {
    let overrides = read_overrides(&job.dir)
        .or_else(|| job.record.as_ref().map(|r| r.overrides.clone()))
        .unwrap_or_default();
    override_assignments(&overrides)
        .into_iter()
        .map(|(key, text)| {
            let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            (key, value)
        })
        .collect()
}

/// Per job: the parameters whose values are not the same in every job. A single job shows its
/// task overrides.
fn differing_params(
    jobs: &[(FoundJob, JobMetrics, Option<Node>)],
) -> Vec<IndexMap<String, serde_json::Value>> {
    let flat: Vec<IndexMap<String, serde_json::Value>> = jobs
        .iter()
        .map(|(job, _, config)| match config {
            Some(c) => {
                let mut leaves = IndexMap::new();
                crate::diff::leaves(c, "", &mut leaves);
                leaves
                    .into_iter()
                    .map(|(k, v)| (k, flotilla_config::node::to_json(&v)))
                    .collect()
            }
            None => override_params(job),
        })
        .collect();
    if flat.len() == 1 {
        let overrides = override_params(&jobs[0].0);
        return vec![overrides
            .into_iter()
            .map(|(k, v)| {
                let value = flat[0].get(&k).cloned().unwrap_or(v);
                (k, value)
            })
            .collect()];
    }
    // A key differs when two jobs that have it disagree, or when a job composed from a config
    // lacks it; a job known only by its overrides says nothing about the keys it does not set.
    let has_config: Vec<bool> = jobs.iter().map(|(_, _, c)| c.is_some()).collect();
    let mut keys: IndexMap<String, ()> = IndexMap::new();
    for f in &flat {
        for k in f.keys() {
            keys.insert(k.clone(), ());
        }
    }
    let differing: Vec<&String> = keys
        .keys()
        .filter(|k| {
            let mut present = flat.iter().filter_map(|f| f.get(*k));
            let first = present.next();
            present.any(|v| Some(v) != first)
                || flat
                    .iter()
                    .zip(&has_config)
                    .any(|(f, has)| *has && !f.contains_key(*k))
        })
        .collect();
    flat.iter()
        .map(|f| {
            differing
                .iter()
                .map(|k| {
                    let v = f.get(*k).cloned().unwrap_or(serde_json::Value::Null);
                    ((*k).clone(), v)
                })
                .collect()
        })
        .collect()
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

fn row(
    job: FoundJob,
    metrics: JobMetrics,
    has_config: bool,
    params: IndexMap<String, serde_json::Value>,
    metric: &str,
    mode: Mode,
) -> JobRow {
    let mut reasons: Vec<String> = Vec::new();
    let steps = metrics.last_step().map_or(0, |s| s + 1);
    let marks = Markers {
        steps: Some(steps),
        final_model: has_final_model(&job.dir),
    };
    let state = match &job.record {
        Some(record) => {
            if let Some(m) = &record.message {
                reasons.push(m.clone());
            }
            // As `flotilla status`: a job its gone `flotilla run` left RUNNING is UNKNOWN.
            let live = job.stale.as_ref().map(|_| JobState::Unknown);
            let state = combine(record.state, live, &marks);
            if state == JobState::Unknown {
                reasons.extend(job.stale.clone());
            }
            state
        }
        None if marks.final_model => JobState::Completed,
        None => JobState::Unknown,
    };
    if let Some(p) = &job.plan_problem {
        reasons.push(p.clone());
    }
    if !job.dir.is_dir() {
        reasons.push("the job directory is missing".into());
    } else if !has_config {
        reasons.push(format!("no readable {CONFIG_FILE}"));
    }
    if let Some(p) = &metrics.problem {
        reasons.push(p.clone());
    }
    let series = metrics.get(metric);
    if series.is_none() && metrics.problem.is_none() && !metrics.series.is_empty() {
        reasons.push(format!("no '{metric}' logged yet"));
    }
    let final_value = series.and_then(|s| s.last()).map(|(_, v)| *v);
    let mut best: Option<(u64, f64)> = None;
    for (step, v) in series.into_iter().flatten() {
        if v.is_finite() && best.is_none_or(|(_, b)| mode.better(*v, b)) {
            best = Some((*step, *v));
        }
    }
    if let Some((step, _)) = series.into_iter().flatten().find(|(_, v)| !v.is_finite()) {
        reasons.push(format!("{metric} is not finite from step {step}"));
    }
    // The trainer's own clock, else how long the launcher saw the job's processes run.
    let wall_s = metrics
        .get("elapsed_s")
        .and_then(|s| s.last())
        .map(|(_, v)| *v)
        .or_else(|| job.record.as_ref().and_then(|r| r.wall_s));
    let mut throughput: Vec<f64> = metrics
        .get("tokens_per_s")
        .into_iter()
        .flatten()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .collect();
    JobRow {
        num: job.num,
        dir: job.dir,
        sweep: None,
        state,
        params,
        final_value,
        best: best.map(|(_, v)| v),
        best_step: best.map(|(s, _)| s),
        steps,
        wall_s,
        tokens_per_s: median(&mut throughput),
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        metrics,
    }
}

/// The columns a report can be sorted by, for the error message.
const SORT_COLUMNS: [&str; 9] = [
    "num",
    "sweep",
    "state",
    "final",
    "best",
    "best_step",
    "steps",
    "wall_s",
    "tokens_per_s",
];

fn sort_rows(rows: &mut [JobRow], options: &ReportOptions, mode: Mode) -> Result<(), ReportError> {
    let key = match (&options.sort, options.top) {
        (Some(k), _) => k.as_str(),
        (None, Some(_)) => "best",
        (None, None) => return Ok(()),
    };
    // Missing values last; metric columns best first.
    let by_metric = |a: Option<f64>, b: Option<f64>| {
        let known = |v: Option<f64>| v.filter(|v| !v.is_nan());
        nones_last(known(a), known(b), |x, y| match mode {
            Mode::Min => x.total_cmp(&y),
            Mode::Max => y.total_cmp(&x),
        })
    };
    let ascending = |a: Option<f64>, b: Option<f64>| nones_last(a, b, |x, y| x.total_cmp(&y));
    match key {
        "num" => rows.sort_by_key(|r| r.num),
        "sweep" => rows.sort_by(|a, b| a.sweep.cmp(&b.sweep).then(a.num.cmp(&b.num))),
        "state" => rows.sort_by_key(|r| r.state.as_str()),
        "final" => rows.sort_by(|a, b| by_metric(a.final_value, b.final_value)),
        "best" => rows.sort_by(|a, b| by_metric(a.best, b.best)),
        "best_step" => rows.sort_by_key(|r| r.best_step.unwrap_or(u64::MAX)),
        "steps" => rows.sort_by_key(|r| r.steps),
        "wall_s" => rows.sort_by(|a, b| ascending(a.wall_s, b.wall_s)),
        "tokens_per_s" => rows.sort_by(|a, b| ascending(b.tokens_per_s, a.tokens_per_s)),
        param if rows.iter().any(|r| r.params.contains_key(param)) => {
            rows.sort_by(|a, b| compare_json(a.params.get(param), b.params.get(param)))
        }
        other => {
            let mut choices: Vec<String> = SORT_COLUMNS.iter().map(|s| s.to_string()).collect();
            if let Some(r) = rows.first() {
                choices.extend(r.params.keys().cloned());
            }
            return Err(ReportError::SortKey {
                key: other.into(),
                choices: choices.join(", "),
            });
        }
    }
    Ok(())
}

/// Orders known values by `cmp`, after them the missing ones.
fn nones_last<T>(a: Option<T>, b: Option<T>, cmp: impl Fn(T, T) -> Ordering) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => cmp(x, y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Parameter values: numbers by value, anything else by its JSON text.
fn compare_json(a: Option<&serde_json::Value>, b: Option<&serde_json::Value>) -> Ordering {
    nones_last(a, b, |x, y| match (x.as_f64(), y.as_f64()) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => x.to_string().cmp(&y.to_string()),
    })
}
