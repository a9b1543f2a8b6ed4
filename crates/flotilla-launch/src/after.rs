//! `flotilla run --after DIR` / `--after-any DIR`: new jobs that start only once the jobs of
//! another run or sweep directory have ended (successfully, or however). [`refuse_failed`]
//! refuses at once, before anything is created, when a job of DIR already failed; [`dependency`]
//! gives the `sbatch --dependency` of DIR's recorded SLURM ids (array and packed allocations
//! included) when both sides are SLURM; otherwise [`wait`] polls DIR's status until its jobs
//! have ended.

use crate::rundir::status::RunStatus;
use crate::rundir::{JobState, PlanFile};
use crate::LaunchError;
use flotilla_config::schema::Launcher as LauncherKind;
use std::path::PathBuf;
use std::time::Duration;

/// What the new jobs wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterMode {
    /// Every job of DIR COMPLETED (`afterok`).
    Ok,
    /// Every job of DIR ended, however (`afterany`).
    Any,
}

/// `--after DIR` or `--after-any DIR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct After {
    pub dir: PathBuf,
    pub mode: AfterMode,
    /// Seconds between two looks at DIR while waiting locally.
    pub poll: Duration,
}

/// A state that no successful end follows.
fn unsuccessful(state: JobState) -> bool {
    state.is_terminal() && !matches!(state, JobState::Completed | JobState::Pruned)
}

/// Under `--after` (not `--after-any`): the first job of DIR that already ended without
/// completing, as an error naming it and its reason.
pub fn refuse_failed(after: &After) -> Result<RunStatus, LaunchError> {
    let st = crate::status(&after.dir)?;
    if after.mode == AfterMode::Ok {
        if let Some(j) = st.jobs.iter().find(|j| unsuccessful(j.state)) {
            let why = j
                .message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Err(LaunchError::Unsupported(format!(
                "--after {}: its job {} ({}) ended {}{why}; the new jobs would never start. Run it \
                 again (flotilla run --resume-sweep {}), or use --after-any to start once it has \
                 ended however",
                after.dir.display(),
                j.num,
                j.dir.display(),
                j.state,
                after.dir.display()
            )));
        }
    }
    Ok(st)
}

/// The `sbatch --dependency` value (`afterok:12_0:13`) for new SLURM jobs after the SLURM jobs
/// of `dir` that have not ended yet; `None` when they all have, or when `dir` is not a SLURM
/// run (then [`wait`]).
pub fn dependency(after: &After, st: &RunStatus) -> Result<Option<String>, LaunchError> {
    if st.launcher != Some(LauncherKind::Slurm) || st.all_terminal() {
        return Ok(None);
    }
    let plan_file = PlanFile::find(&after.dir)
        .or_else(|| st.sweep_dir.as_deref().and_then(PlanFile::find))
        .ok_or_else(|| {
            LaunchError::Unsupported(format!(
                "--after {}: no sweep.json or job.json records its jobs",
                after.dir.display()
            ))
        })?;
    let plan = plan_file.read()?;
    let mut ids: Vec<String> = Vec::new();
    for j in &plan.jobs {
        if st
            .jobs
            .iter()
            .any(|s| s.num == j.num && s.state.is_terminal())
        {
            continue;
        }
        if let Some(array) = j.extra.get(crate::slurm::pack::PACK_ARRAY_KEY) {
            // A packed job: its array of allocations (each exits non-zero when a job it ran
            // failed).
            ids.extend(array.as_str().map(str::to_string));
        } else {
            ids.extend(j.job_id.clone());
        }
    }
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return Err(LaunchError::Unsupported(format!(
            "--after {}: its jobs have not ended and none has a SLURM id to depend on (submitted \
             with --dry-run?)",
            after.dir.display()
        )));
    }
    let kind = match after.mode {
        AfterMode::Ok => "afterok",
        AfterMode::Any => "afterany",
    };
    Ok(Some(format!("{kind}:{}", ids.join(":"))))
}

/// Polls the status of `after.dir` until every job has ended; under `--after`, an error when
/// one did not complete.
pub fn wait(after: &After) -> Result<(), LaunchError> {
    loop {
        let st = refuse_failed(after)?;
        if st.all_terminal() {
            return Ok(());
        }
        tracing::info!(
            "--after {}: {} of {} job(s) still running; waiting",
            after.dir.display(),
            st.jobs.iter().filter(|j| !j.state.is_terminal()).count(),
            st.jobs.len()
        );
        std::thread::sleep(after.poll);
    }
}
