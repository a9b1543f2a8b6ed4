//! The run plan file: `sweep.json` in a sweep directory, `job.json` in the directory of a
//! single run. It lists every job (number, directory, task overrides), the launcher's id for it
//! and its state, and is rewritten atomically (temporary file + rename, under an advisory lock)
//! whenever a job moves. Launchers record their ids and states through [`PlanFile`].

use super::{io_err, RunDirError};
use flotilla_config::schema::Launcher as LauncherKind;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use flotilla_contract::layout::{JOB_FILE, SWEEP_FILE};
/// Version of the plan format written by this build.
pub const PLAN_VERSION: u32 = 1;
/// Key of a job's record (in [`JobRecord::extra`]): the job step that ran it in an allocation
/// of a packed sweep (`compute.pack`). The SLURM launcher's packing loop records it; a run's
/// status reports it.
pub const STEP_KEY: &str = "step";

/// Where a job stands. Serialised as SLURM spells its states (`PENDING`, `RUNNING`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Prepared (or submitted and queued), not started.
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// Stopped at its time limit.
    Timeout,
    Preempted,
    /// Requeued by the scheduler (or by itself after a time-limit signal); will run again.
    Requeued,
    NodeFail,
    OutOfMemory,
    /// Stopped early by an adaptive sweep's pruner (its checkpoint kept).
    Pruned,
    /// Not known (e.g. the scheduler no longer knows the job and the directory says nothing).
    Unknown,
}

impl JobState {
    pub const ALL: [JobState; 12] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::Preempted,
        JobState::Requeued,
        JobState::NodeFail,
        JobState::OutOfMemory,
        JobState::Pruned,
        JobState::Unknown,
    ];

    /// The upper-case name (`"COMPLETED"`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::Preempted => "PREEMPTED",
            JobState::Requeued => "REQUEUED",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Pruned => "PRUNED",
            JobState::Unknown => "UNKNOWN",
        }
    }

    /// Will the job not move any more (by itself)?
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Timeout
                | JobState::NodeFail
                | JobState::OutOfMemory
                | JobState::Pruned
        )
    }

    /// A state a job should be re-run from (`--resume-sweep`): anything but COMPLETED (and
    /// PRUNED, which its study decided).
    pub fn needs_rerun(self) -> bool {
        !matches!(self, JobState::Completed | JobState::Pruned)
    }

    /// Parses a state as `squeue -o %T` / `sacct -o State` print it: long names, SLURM's short
    /// codes (`PD`, `R`, `CD`, `F`, `CA`, `TO`, ...), and suffixes such as `CANCELLED by 1000`
    /// or `RUNNING+`. `COMPLETING`/`CONFIGURING` count as RUNNING, `SUSPENDED`/`REQUEUE_*`/
    /// `RESIZING` as their nearest state, anything else as UNKNOWN.
    pub fn from_slurm(text: &str) -> JobState {
        let word = text
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+')
            .to_ascii_uppercase();
        match word.as_str() {
            "PENDING" | "PD" => JobState::Pending,
            "RUNNING" | "R" | "COMPLETING" | "CG" | "CONFIGURING" | "CF" | "SUSPENDED" | "S"
            | "STOPPED" | "ST" | "SIGNALING" | "SI" | "STAGE_OUT" | "SO" | "RESIZING" | "RS" => {
                JobState::Running
            }
            "COMPLETED" | "CD" => JobState::Completed,
            "FAILED" | "F" | "BOOT_FAIL" | "BF" | "DEADLINE" | "DL" | "SPECIAL_EXIT" | "SE" => {
                JobState::Failed
            }
            "CANCELLED" | "CA" | "REVOKED" | "RV" => JobState::Cancelled,
            "TIMEOUT" | "TO" => JobState::Timeout,
            "PREEMPTED" | "PR" => JobState::Preempted,
            "REQUEUED" | "RQ" | "REQUEUE_FED" | "RF" | "REQUEUE_HOLD" | "RH" => JobState::Requeued,
            "NODE_FAIL" | "NF" => JobState::NodeFail,
            "OUT_OF_MEMORY" | "OOM" => JobState::OutOfMemory,
            _ => JobState::Unknown,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;

    /// Exactly one of the upper-case names (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let up = s.trim().to_ascii_uppercase();
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == up)
            .ok_or_else(|| format!("unknown job state '{s}'"))
    }
}

/// One job of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job number (the sweep's `flotilla.job.num`; 0 for a single run).
    pub num: usize,
    /// The job directory, relative to the plan's directory (`"."` for a single run).
    pub dir: PathBuf,
    /// The job's task overrides (`key=value`), as in its `overrides.yaml`.
    pub overrides: Vec<String>,
    /// The launcher's id (SLURM: `<array id>_<task>` or the job id); `null` locally.
    pub job_id: Option<String>,
    pub state: JobState,
    /// When `state` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// Why the job failed or was cancelled (failing rank, exit status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Seconds from the start of the job's processes to the end of the last one, recorded by
    /// the local launcher when the job ends (a program's own metrics may not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// Launcher-specific fields (kept verbatim on rewrite).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl JobRecord {
    /// A PENDING job with no launcher id.
    pub fn pending(num: usize, dir: PathBuf, overrides: Vec<String>) -> JobRecord {
        JobRecord {
            num,
            dir,
            overrides,
            job_id: None,
            state: JobState::Pending,
            updated: None,
            message: None,
            wall_s: None,
            extra: serde_json::Map::new(),
        }
    }

    /// Sets the state (and the `updated` time); `message` replaces the old message.
    pub fn set_state(&mut self, state: JobState, message: Option<String>) {
        self.state = state;
        self.message = message;
        self.updated = Some(super::now_rfc3339());
    }
}

/// The content of `sweep.json` / `job.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// [`PLAN_VERSION`].
    pub version: u32,
    /// `true` for a sweep (`sweep.json`), `false` for a single run (`job.json`).
    pub sweep: bool,
    /// When the directories were prepared (RFC 3339).
    pub created: String,
    /// `local` or `slurm` (the jobs' `compute.launcher`).
    pub launcher: LauncherKind,
    /// The command line that prepared the plan.
    pub argv: Vec<String>,
    /// Every job, ordered by number.
    pub jobs: Vec<JobRecord>,
    /// Launcher-specific fields (kept verbatim on rewrite), e.g. SLURM array ids.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Plan {
    /// A new plan of [`PLAN_VERSION`]: made `created` by the command `argv`, its jobs on
    /// `launcher`, with the job name (`--job-name` under SLURM) when known.
    pub fn new(
        sweep: bool,
        created: String,
        launcher: LauncherKind,
        argv: Vec<String>,
        jobs: Vec<JobRecord>,
        job_name: Option<&str>,
    ) -> Plan {
        Plan {
            version: PLAN_VERSION,
            sweep,
            created,
            launcher,
            argv,
            jobs,
            extra: job_name
                .map(|n| (super::JOB_NAME_KEY.to_string(), serde_json::Value::from(n)))
                .into_iter()
                .collect(),
        }
    }

    pub fn job(&self, num: usize) -> Option<&JobRecord> {
        self.jobs.iter().find(|j| j.num == num)
    }

    pub fn job_mut(&mut self, num: usize) -> Option<&mut JobRecord> {
        self.jobs.iter_mut().find(|j| j.num == num)
    }
}

/// A plan file on disk and the directory its job paths are relative to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanFile {
    dir: PathBuf,
    name: &'static str,
}

impl PlanFile {
    /// `sweep_dir/sweep.json`.
    pub fn sweep(sweep_dir: impl Into<PathBuf>) -> PlanFile {
        PlanFile {
            dir: sweep_dir.into(),
            name: SWEEP_FILE,
        }
    }

    /// `job_dir/job.json` (a single run).
    pub fn single(job_dir: impl Into<PathBuf>) -> PlanFile {
        PlanFile {
            dir: job_dir.into(),
            name: JOB_FILE,
        }
    }

    /// The plan file directly in `dir` (`sweep.json` first, then `job.json`), if any.
    pub fn find(dir: &Path) -> Option<PlanFile> {
        if dir.join(SWEEP_FILE).is_file() {
            Some(PlanFile::sweep(dir))
        } else if dir.join(JOB_FILE).is_file() {
            Some(PlanFile::single(dir))
        } else {
            None
        }
    }

    /// The directory the plan lives in (the sweep directory, or the single run's directory).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The plan file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.name)
    }

    /// Is this a sweep's plan (`sweep.json`)?
    pub fn is_sweep(&self) -> bool {
        self.name == SWEEP_FILE
    }

    /// The directory of one job of this plan.
    pub fn job_dir(&self, job: &JobRecord) -> PathBuf {
        if job.dir.as_os_str() == "." || job.dir.as_os_str().is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(&job.dir)
        }
    }

    /// Reads the plan.
    pub fn read(&self) -> Result<Plan, RunDirError> {
        let path = self.path();
        let text = std::fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
        serde_json::from_str(&text).map_err(|error| RunDirError::Json { path, error })
    }

    /// Replaces the plan (atomically, under the plan's lock).
    pub fn write(&self, plan: &Plan) -> Result<(), RunDirError> {
        let _lock = self.lock()?;
        self.write_unlocked(plan)
    }

    /// Reads, changes and rewrites the plan under its lock, so that concurrent updaters (the
    /// jobs of a parallel local sweep, SLURM array tasks) never lose each other's changes.
    pub fn update<T>(&self, f: impl FnOnce(&mut Plan) -> T) -> Result<T, RunDirError> {
        let _lock = self.lock()?;
        let mut plan = self.read()?;
        let out = f(&mut plan);
        self.write_unlocked(&plan)?;
        Ok(out)
    }

    /// Changes one job's record (see [`PlanFile::update`]).
    pub fn update_job<T>(
        &self,
        num: usize,
        f: impl FnOnce(&mut JobRecord) -> T,
    ) -> Result<T, RunDirError> {
        let path = self.path();
        self.update(|plan| plan.job_mut(num).map(f))?
            .ok_or(RunDirError::NoSuchJob { num, path })
    }

    /// Sets one job's state (and message), keeping its launcher id.
    pub fn set_state(
        &self,
        num: usize,
        state: JobState,
        message: Option<String>,
    ) -> Result<(), RunDirError> {
        self.update_job(num, |j| j.set_state(state, message))
    }

    /// Records how a job ended and how long its processes ran.
    pub fn set_ended(
        &self,
        num: usize,
        state: JobState,
        message: Option<String>,
        wall_s: f64,
    ) -> Result<(), RunDirError> {
        self.update_job(num, |j| {
            j.set_state(state, message);
            j.wall_s = Some(wall_s);
        })
    }

    /// Records the launcher's id of one job (and its state, e.g. PENDING once submitted).
    pub fn set_job_id(
        &self,
        num: usize,
        job_id: Option<String>,
        state: JobState,
    ) -> Result<(), RunDirError> {
        self.update_job(num, |j| {
            j.job_id = job_id;
            j.set_state(state, None);
        })
    }

    pub(crate) fn write_unlocked(&self, plan: &Plan) -> Result<(), RunDirError> {
        let mut text = serde_json::to_string_pretty(plan).map_err(|error| RunDirError::Json {
            path: self.path(),
            error,
        })?;
        text.push('\n');
        super::write_atomic(&self.path(), text.as_bytes())
    }

    /// An exclusive advisory lock on `.<name>.lock` next to the plan, held until dropped.
    fn lock(&self) -> Result<PlanLock, RunDirError> {
        let path = self.dir.join(format!(".{}.lock", self.name));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        file.lock().map_err(|e| io_err(&path, e))?;
        Ok(PlanLock { _file: file })
    }
}

/// Closing the descriptor releases the lock.
struct PlanLock {
    _file: File,
}

/// Writes `plan` as a new plan file without locking (the directory is not visible yet).
pub(crate) fn write_new(file: &PlanFile, plan: &Plan) -> Result<(), RunDirError> {
    file.write_unlocked(plan)
}
