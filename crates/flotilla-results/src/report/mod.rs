//! `flotilla report`: one row per job of the run and sweep directories given — its state (with
//! the reason of a failure), the parameters that differ across the jobs (`params.rs`), the
//! chosen metric's final and best values and the step of the best, steps done, wall time and
//! throughput — or, grouped over swept keys, one row per configuration with the mean and
//! spread of its jobs (`group.rs`); as a table, CSV, JSON or Markdown (`render.rs`), a
//! self-contained HTML page (`html.rs`) with its figures (`figures.rs`, drawn with `svg.rs` and
//! `legend.rs`), or the figures as SVG and PNG files (`png.rs`). Reading only: the report never
//! writes into a run directory, and a broken job (no metrics, a cut or NaN-holding file, no
//! config, an unreadable plan) gets its row with the reason instead of stopping the report.

pub mod discover;
pub mod figures;
pub mod group;
pub mod html;
pub mod legend;
pub mod params;
pub mod png;
pub mod render;
pub mod svg;

use discover::FoundJob;
use flotilla_contract::metrics::{read_job_metrics, read_job_metrics_wanted, JobMetrics, Wanted};
use flotilla_launch::rundir::status::{combine, has_final_model, Markers};
use flotilla_launch::rundir::{JobState, CONFIG_FILE};
use indexmap::IndexMap;
use rayon::prelude::*;
use serde::Serialize;
use std::cmp::Ordering;
use std::path::{Path, PathBuf};

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
    /// throughput. What `flotilla status` asks for. (Either way, only the series a report
    /// uses are parsed.)
    pub metric_only: bool,
    /// The figures will be drawn: the loss is read too (the curves figure draws it).
    pub figures: bool,
    /// Look for every job's `final/` ([`JobRow::final_model`]), not only where the job's state
    /// depends on it: what `flotilla status` shows.
    pub final_models: bool,
    /// Swept keys to group over (`seed`): one row per configuration of the other swept keys,
    /// with the mean, standard deviation and count of its jobs' best values
    /// ([`group::Groups`]). `sort` and `top` then apply to the groups.
    pub group_by: Vec<String>,
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
    /// The job's task overrides, all of them (what `group_by` groups on).
    #[serde(skip)]
    pub overrides: IndexMap<String, serde_json::Value>,
    /// Whether the job directory holds `final/`, when [`ReportOptions::final_models`] asked.
    #[serde(skip)]
    pub final_model: Option<bool>,
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
    /// With `group_by`, the configurations, ranked by their mean (`null` otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<group::Groups>,
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
fn sweep_labels(groups: &[&Path]) -> Vec<Option<String>> {
    // Each distinct path once, by its bytes (a sweep's thousands of jobs share one).
    let mut index: std::collections::HashMap<&std::ffi::OsStr, usize> = Default::default();
    let mut distinct: Vec<&Path> = Vec::new();
    for g in groups {
        index.entry(g.as_os_str()).or_insert_with(|| {
            distinct.push(g);
            distinct.len() - 1
        });
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
        .map(|g| Some(parts[index[g.as_os_str()]][shared..].join("/")))
        .collect()
}

/// Errors that stop a report: only a path that does not exist, a sort key no column has, or a
/// key to group by that no job sweeps.
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
    #[error("cannot group by '{key}': no job sets it by an override; the swept keys are: {swept}")]
    GroupKey { key: String, swept: String },
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
    build_of_jobs(found, options)
}

/// Builds the report of jobs found already (by [`discover::find_jobs`] or
/// [`discover::jobs_of_plan`]), at least one.
pub fn build_of_jobs(found: Vec<FoundJob>, options: &ReportOptions) -> Result<Report, ReportError> {
    // The series a report uses: its metric, the trainer's throughput, for the figures the
    // loss, and the clock's last value; the other columns are not even parsed. The default
    // metric is `eval_loss` where any job logged it, else `loss`: a job that logged
    // `eval_loss` has its `loss` read only for the figures.
    let defaults: [String; 2] = ["eval_loss".into(), "loss".into()];
    let mut whole: Vec<String> = Vec::new();
    let mut first_of: &[String] = &[];
    match &options.metric {
        Some(m) => whole.push(m.clone()),
        None if options.figures => whole.extend(defaults.iter().cloned()),
        None => first_of = &defaults,
    }
    let mut last: Vec<String> = Vec::new();
    if !options.metric_only {
        let curves = options.figures.then_some("loss");
        for name in ["tokens_per_s"].into_iter().chain(curves) {
            if !whole.iter().any(|o| o == name) {
                whole.push(name.into());
            }
        }
        last.push("elapsed_s".into());
    }
    let wanted = Wanted::only(&whole).first_of(first_of).last(&last);
    // Each job's files, read on every core: on a sweep of thousands of jobs this is the
    // report's time.
    let files: Vec<JobFiles> = found
        .par_iter()
        .map(|job| {
            JobFiles::read(
                job,
                &wanted,
                options.metric.as_deref(),
                options.final_models,
            )
        })
        .collect();
    let metric = options.metric.clone().unwrap_or_else(|| {
        if files.iter().any(|f| f.metrics.get("eval_loss").is_some()) {
            "eval_loss".into()
        } else {
            "loss".into()
        }
    });
    let mode = options.mode.unwrap_or_else(|| Mode::for_metric(&metric));
    let groups: Vec<&Path> = found
        .iter()
        .map(|job| job.sweep_dir.as_deref().unwrap_or(&job.dir))
        .collect();
    let has_config: Vec<bool> = files.iter().map(|f| f.has_config).collect();
    let overrides: Vec<IndexMap<String, serde_json::Value>> =
        found.iter().map(params::override_params).collect();
    let params = params::differing_params(&found, &overrides, &groups, &has_config);
    let labels = sweep_labels(&groups);
    drop(groups);
    let rows: Vec<JobRow> = found
        .into_iter()
        .zip(files)
        .zip(params.into_iter().zip(overrides))
        .zip(labels)
        .map(|(((job, files), (params, overrides)), sweep)| {
            let mut row = row(job, files, params, &metric, mode);
            row.sweep = sweep;
            row.overrides = overrides;
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
    let mut report = Report {
        metric,
        mode,
        jobs: rows,
        best,
        groups: None,
    };
    if options.group_by.is_empty() {
        sort_rows(&mut report.jobs, options, mode)?;
        if let Some(k) = options.top {
            report.jobs.truncate(k);
        }
    } else {
        let mut grouped = group::group(&report, &options.group_by)?;
        group::sort_groups(&mut grouped, options.sort.as_deref(), mode)?;
        if let Some(k) = options.top {
            grouped.groups.truncate(k);
        }
        report.groups = Some(grouped);
    }
    Ok(report)
}

/// Refuses a metric no job has logged when it is surely not coming: its name is a near miss of
/// one that was logged (a typo), or a job has already ended with metrics but without it. While
/// every job is still running, a metric not logged yet (the first evaluation) is not an error:
/// the rows say "no 'x' logged yet".
fn check_metric_exists(rows: &[JobRow], metric: &str) -> Result<(), ReportError> {
    if rows.iter().any(|r| r.metrics.get(metric).is_some()) {
        return Ok(());
    }
    // The jobs' files again, whole (only the report's series were read): the metrics they
    // logged, in the order the files have them.
    let logged: Vec<JobMetrics> = rows.iter().map(|r| read_job_metrics(&r.dir)).collect();
    let mut available: Vec<&str> = Vec::new();
    for m in &logged {
        for name in m.series.keys() {
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
        .any(|r| r.state.is_terminal() && r.metrics.logged().next().is_some());
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

/// What a report reads of one job's directory: its metrics (the series it uses), whether its
/// config is there, and the figures of its row taken from series it then lets go of.
struct JobFiles {
    metrics: JobMetrics,
    has_config: bool,
    /// The trainer's clock at the last step.
    elapsed_s: Option<f64>,
    /// The median throughput over the logged steps.
    tokens_per_s: Option<f64>,
    /// Whether the directory holds `final/`, when asked.
    final_model: Option<bool>,
}

impl JobFiles {
    /// Reads `job`'s files: the series `wanted` of its metrics; `elapsed_s` and `tokens_per_s`
    /// are summed up at once and dropped unless they are the report's `metric` (a sweep of
    /// thousands of jobs would hold them all).
    fn read(job: &FoundJob, wanted: &Wanted, metric: Option<&str>, final_model: bool) -> JobFiles {
        let mut metrics = read_job_metrics_wanted(&job.dir, wanted);
        let elapsed_s = metrics
            .get("elapsed_s")
            .and_then(|s| s.last())
            .map(|(_, v)| *v);
        let mut throughput: Vec<f64> = metrics
            .get("tokens_per_s")
            .into_iter()
            .flatten()
            .map(|(_, v)| *v)
            .filter(|v| v.is_finite())
            .collect();
        for name in ["elapsed_s", "tokens_per_s"] {
            if metric != Some(name) && metrics.series.shift_remove(name).is_some() {
                metrics.unread.push(name.to_string());
            }
        }
        JobFiles {
            metrics,
            has_config: job.dir.join(CONFIG_FILE).is_file(),
            elapsed_s,
            tokens_per_s: median(&mut throughput),
            final_model: final_model.then(|| has_final_model(&job.dir)),
        }
    }
}

fn row(
    job: FoundJob,
    files: JobFiles,
    params: IndexMap<String, serde_json::Value>,
    metric: &str,
    mode: Mode,
) -> JobRow {
    let JobFiles {
        metrics,
        has_config,
        elapsed_s,
        tokens_per_s,
        final_model,
    } = files;
    let mut reasons: Vec<String> = Vec::new();
    let steps = metrics.last_step().map_or(0, |s| s + 1);
    // `final/` only matters to a job not recorded COMPLETED already (it makes it so).
    let recorded_complete = job
        .record
        .as_ref()
        .is_some_and(|r| r.state == JobState::Completed);
    let marks = Markers {
        steps: Some(steps),
        final_model: !recorded_complete && final_model.unwrap_or_else(|| has_final_model(&job.dir)),
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
    // A job with a config or metrics has its directory: no need to ask.
    if !has_config && metrics.source.is_none() && !job.dir.is_dir() {
        reasons.push("the job directory is missing".into());
    } else if !has_config {
        reasons.push(format!("no readable {CONFIG_FILE}"));
    }
    if let Some(p) = &metrics.problem {
        reasons.push(p.clone());
    }
    let series = metrics.get(metric);
    if series.is_none() && metrics.problem.is_none() && metrics.logged().next().is_some() {
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
    let wall_s = elapsed_s.or_else(|| job.record.as_ref().and_then(|r| r.wall_s));
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
        tokens_per_s,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        metrics,
        overrides: IndexMap::new(),
        final_model,
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
