//! `flotilla run`: [`run`] prepares the directories of a run or sweep and starts or submits
//! its jobs with the launcher [`launcher_for`] picks for `compute.launcher`; [`RunReport`] is
//! what it (and [`resume`](crate::resume)) did, as JSON or text.

use crate::rundir::{self, JobState, PreparedRun, RunRequest};
use crate::{slurm, JobOutcome, LaunchError, Launcher, LocalLauncher, LocalOptions};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::Composer;
use std::path::Path;

/// What [`run`] does besides preparing.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Prepare directories (and scripts) and start nothing.
    pub dry_run: bool,
    pub local: LocalOptions,
}

/// The result of `flotilla run`.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub run: PreparedRun,
    pub outcomes: Vec<JobOutcome>,
    pub dry_run: bool,
}

/// `flotilla run`: composes and validates every job, prepares the directories, then (unless
/// `dry_run`) starts or submits the jobs with their launcher.
pub fn run(
    composer: &Composer,
    req: &RunRequest,
    opts: RunOptions,
) -> Result<RunReport, LaunchError> {
    run_after(composer, req, opts, None)
}

/// [`run`] whose jobs start only once the jobs of `after.dir` have ended (`flotilla run
/// --after`): through `sbatch --dependency` when both are SLURM jobs, else by waiting here
/// before starting them. A job of `after.dir` that already failed (under `--after`) refuses the
/// run before anything is created.
pub fn run_after(
    composer: &Composer,
    req: &RunRequest,
    opts: RunOptions,
    after: Option<&crate::after::After>,
) -> Result<RunReport, LaunchError> {
    // A job of DIR that already failed refuses the run before anything is created.
    let after = match after {
        Some(a) => Some((a, crate::after::refuse_failed(a)?)),
        None => None,
    };
    let prepared = rundir::prepare(composer, req)?;
    let dependency = match &after {
        Some((a, st)) if prepared.launcher == LauncherKind::Slurm => {
            crate::after::dependency(a, st)?
        }
        _ => None,
    };
    let mut launcher: Box<dyn crate::Launcher> = match dependency {
        Some(dep) => {
            let mut o = crate::slurm::SlurmOptions::with_task(opts.local.task.clone());
            o.exec_task = opts.local.exec_task.clone();
            o.dependency = Some(dep);
            Box::new(crate::slurm::SlurmLauncher::new(o))
        }
        None => {
            // Not the scheduler's to wait for: wait here (unless only preparing).
            if let (Some((a, _)), false) = (&after, opts.dry_run) {
                crate::after::wait(a)?;
            }
            launcher_for(prepared.launcher, opts.local)?
        }
    };
    launcher.prepare(&prepared)?;
    let outcomes = if opts.dry_run {
        prepared.jobs.iter().map(JobOutcome::pending).collect()
    } else {
        launcher.launch(&prepared)?
    };
    Ok(RunReport {
        run: prepared,
        outcomes,
        dry_run: opts.dry_run,
    })
}

/// The launcher for `compute.launcher`.
pub fn launcher_for(
    kind: LauncherKind,
    local: LocalOptions,
) -> Result<Box<dyn Launcher>, LaunchError> {
    match kind {
        LauncherKind::Local => Ok(Box::new(LocalLauncher::new(local))),
        LauncherKind::Slurm => {
            let mut opts = slurm::SlurmOptions::with_task(local.task);
            opts.exec_task = local.exec_task;
            Ok(Box::new(slurm::SlurmLauncher::new(opts)))
        }
    }
}

fn path_json(p: &Path) -> serde_json::Value {
    serde_json::Value::String(p.to_string_lossy().into_owned())
}

impl RunReport {
    /// `{"sweep_dir": DIR|null, "jobs": [{"num": N, "dir": DIR, "job_id": ID|null, "state": S}]}`
    pub fn to_json(&self) -> String {
        let jobs: Vec<serde_json::Value> = self
            .outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "num": o.num,
                    "dir": path_json(&o.dir),
                    "job_id": o.job_id,
                    "state": o.state.as_str(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "sweep_dir": self.run.sweep_dir.as_deref().map(path_json),
            "jobs": jobs,
        });
        format!("{doc}\n")
    }

    /// A summary for people.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let n = self.outcomes.len();
        let verb = if self.dry_run {
            "prepared"
        } else if self.outcomes.iter().any(|o| o.job_id.is_some()) {
            "submitted"
        } else {
            "finished"
        };
        match &self.run.sweep_dir {
            Some(d) => out.push_str(&format!(
                "{verb} sweep {} ({n} job{})\n",
                d.display(),
                if n == 1 { "" } else { "s" }
            )),
            None => out.push_str(&format!("{verb} run {}\n", self.run.plan.dir().display())),
        }
        for (o, job) in self.outcomes.iter().zip(&self.run.jobs) {
            let ov = if job.overrides.is_empty() {
                "(defaults)".to_string()
            } else {
                job.overrides.join(" ")
            };
            let id = o.job_id.as_deref().unwrap_or("-");
            out.push_str(&format!(
                "{:>5}  {:<10} {:<8} {}  {}\n",
                o.num,
                o.state.as_str(),
                id,
                o.dir.display(),
                ov
            ));
        }
        out
    }

    /// One message per job that did not complete (empty on a dry run or a submission).
    pub fn problems(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter(|o| matches!(o.state, JobState::Failed | JobState::Cancelled))
            .map(|o| {
                let why = match (&o.failure, &o.message) {
                    (Some(f), _) => f.to_string(),
                    (None, Some(m)) => m.clone(),
                    (None, None) => String::new(),
                };
                let state = o.state.as_str().to_ascii_lowercase();
                if why.is_empty() {
                    format!("job {} {state} ({})", o.num, o.dir.display())
                } else {
                    format!("job {} {state} ({}): {why}", o.num, o.dir.display())
                }
            })
            .collect()
    }

    /// Did every started job complete (always true for a dry run or a submission)?
    pub fn succeeded(&self) -> bool {
        self.problems().is_empty()
    }
}
