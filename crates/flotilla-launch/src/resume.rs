//! `flotilla run --resume-sweep DIR`: [`resume`] starts (or submits) again the jobs of a run
//! or sweep directory that did not complete, from their prepared directories
//! ([`prepared_job_from_dir`]).

use crate::rundir::{self, JobState, PreparedRun, RunDirError};
use crate::{launcher_for, status, JobOutcome, LaunchError, RunOptions, RunReport};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::ConfigError;
use std::path::{Path, PathBuf};

/// The validated job config in a prepared job directory's `config.yaml`.
pub fn read_job_config(job_dir: &Path) -> Result<flotilla_config::schema::JobConfig, LaunchError> {
    let path = job_dir.join(rundir::CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        LaunchError::RunDir(RunDirError::Io {
            path: path.clone(),
            error: e,
        })
    })?;
    let node = flotilla_config::yaml::load_str(&text, &path.display().to_string())
        .map_err(ConfigError::from)?;
    Ok(flotilla_config::schema::validate(&node).map_err(ConfigError::from)?)
}

/// A prepared job directory as a job to start again: its `task.json` (the user's program) or
/// its validated `config.yaml` (the built-in trainer).
pub fn prepared_job_from_dir(
    num: usize,
    dir: PathBuf,
    overrides: Vec<String>,
) -> Result<rundir::PreparedJob, LaunchError> {
    let task = rundir::TaskSpec::read(&dir).map_err(|e| LaunchError::Task(e.to_string()))?;
    let (config, compute) = match &task {
        Some(task) => (None, task.compute.clone()),
        None => {
            let config = read_job_config(&dir)?;
            let compute = config.compute.clone();
            (Some(config), compute)
        }
    };
    Ok(rundir::PreparedJob {
        num,
        config,
        compute,
        task,
        overrides,
        dir,
    })
}

/// `flotilla run --resume-sweep DIR`: starts (or re-submits) again the jobs of a sweep or run
/// directory that did not complete — FAILED, CANCELLED, TIMEOUT, UNKNOWN, never started —
/// with the launcher recorded in its plan and each job's own `config.yaml`; the trainer resumes
/// from the job's checkpoints. Jobs still in flight (RUNNING, or queued with a scheduler id)
/// are left alone.
pub fn resume(dir: &Path, opts: RunOptions) -> Result<RunReport, LaunchError> {
    let plan_file = rundir::PlanFile::find(dir).ok_or_else(|| RunDirError::NotARunDir {
        path: dir.to_path_buf(),
    })?;
    let plan = plan_file.read()?;
    let current = status(dir)?;
    let kind = plan.launcher;
    let root = std::path::absolute(plan_file.dir())
        .map_err(|e| LaunchError::io(format!("resolving {}", dir.display()), e))?;
    let plan_file = if plan_file.is_sweep() {
        rundir::PlanFile::sweep(&root)
    } else {
        rundir::PlanFile::single(&root)
    };
    let mut jobs = Vec::new();
    for js in &current.jobs {
        let Some(rec) = plan.job(js.num) else {
            continue;
        };
        let in_flight = match kind {
            LauncherKind::Slurm => {
                // A packed job waits in its array's queue without an id of its own.
                matches!(
                    js.state,
                    JobState::Pending | JobState::Running | JobState::Requeued
                ) && (rec.job_id.is_some() || crate::slurm::pack::is_packed(rec))
            }
            LauncherKind::Local => js.state == JobState::Running,
        };
        if js.state == JobState::Completed || in_flight {
            continue;
        }
        jobs.push(prepared_job_from_dir(
            rec.num,
            plan_file.job_dir(rec),
            rec.overrides.clone(),
        )?);
    }
    let prepared = PreparedRun {
        sweep_dir: plan_file.is_sweep().then(|| root.clone()),
        plan: plan_file,
        launcher: kind,
        jobs,
    };
    let mut launcher = launcher_for(kind, opts.local)?;
    let outcomes = if prepared.jobs.is_empty() {
        Vec::new()
    } else {
        launcher.prepare(&prepared)?;
        if opts.dry_run {
            prepared.jobs.iter().map(JobOutcome::pending).collect()
        } else {
            launcher.launch(&prepared)?
        }
    };
    Ok(RunReport {
        run: prepared,
        outcomes,
        dry_run: opts.dry_run,
    })
}
