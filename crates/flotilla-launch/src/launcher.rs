//! What every launcher shares: the [`Launcher`] trait, how a job ended ([`JobOutcome`], with
//! the rank to blame in [`RankFailure`] and how its process ended in [`TaskExit`]), the command
//! every rank runs ([`TaskCommand`]), and the tail of a rank's log ([`log_tail`]).
//!
//! The launchers ([`crate::local`], [`crate::slurm`]) build on this module and it names none of
//! them; the choice of one for `compute.launcher` ([`launcher_for`](crate::launcher_for)) is made
//! above them, in `run`.

use crate::rundir::{self, JobState, PreparedRun};
use crate::train_binary::locate_train_binary;
use crate::{settings, LaunchError};
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How a rank's process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskExit {
    Code(i32),
    Signal(i32),
}

impl TaskExit {
    pub fn from_status(status: std::process::ExitStatus) -> TaskExit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => TaskExit::Code(c),
            (None, Some(s)) => TaskExit::Signal(s),
            (None, None) => TaskExit::Code(-1),
        }
    }

    pub fn success(self) -> bool {
        self == TaskExit::Code(0)
    }
}

impl fmt::Display for TaskExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TaskExit::Code(c) => write!(f, "exited with code {c}"),
            TaskExit::Signal(s) => write!(f, "was killed by signal {s} ({})", signal_name(s)),
        }
    }
}

/// `SIGTERM` for 15, ...
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// The rank that made a job fail.
#[derive(Clone, Debug, PartialEq)]
pub struct RankFailure {
    pub rank: usize,
    pub exit: TaskExit,
    /// Its log file (`JOBDIR/logs/rank_<R>.log`).
    pub log: PathBuf,
    /// The last lines of that log.
    pub tail: Vec<String>,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} {}", self.rank, self.exit)?;
        if self.tail.is_empty() {
            write!(f, " (its log {} is empty)", self.log.display())
        } else {
            write!(f, "; last lines of {}:", self.log.display())?;
            for line in &self.tail {
                write!(f, "\n  | {line}")?;
            }
            Ok(())
        }
    }
}

/// What became of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutcome {
    pub num: usize,
    pub dir: PathBuf,
    /// The launcher's id (SLURM job id); `None` locally.
    pub job_id: Option<String>,
    /// COMPLETED / FAILED / CANCELLED locally; PENDING once submitted (or on a dry run).
    pub state: JobState,
    /// Why a local job failed.
    pub failure: Option<RankFailure>,
    /// Why the job failed when no rank is to blame (e.g. a rank could not be started).
    pub message: Option<String>,
}

impl JobOutcome {
    pub fn pending(job: &rundir::PreparedJob) -> JobOutcome {
        JobOutcome {
            num: job.num,
            dir: job.dir.clone(),
            job_id: None,
            state: JobState::Pending,
            failure: None,
            message: None,
        }
    }
}

/// Starts (or submits) prepared jobs.
pub trait Launcher {
    /// `local` or `slurm`.
    fn name(&self) -> &'static str;

    /// Writes what the launcher needs into the prepared directories (sbatch scripts); runs on
    /// `--dry-run` too. Starts nothing.
    fn prepare(&mut self, _run: &PreparedRun) -> Result<(), LaunchError> {
        Ok(())
    }

    /// Starts or submits every job of `run`, recording ids and states in its plan file. The
    /// local launcher returns when its jobs have ended; a scheduler returns once submitted.
    fn launch(&mut self, run: &PreparedRun) -> Result<Vec<JobOutcome>, LaunchError>;
}

/// Placeholder in a [`TaskCommand`] replaced by the job directory.
pub const JOB_DIR_PLACEHOLDER: &str = "{job_dir}";

/// The command every rank of a job runs; `{job_dir}` in an argument is replaced by the job
/// directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCommand {
    pub argv: Vec<OsString>,
}

impl TaskCommand {
    /// Any command (tests start small scripts this way).
    pub fn new<I, S>(argv: I) -> TaskCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        TaskCommand {
            argv: argv.into_iter().map(Into::into).collect(),
        }
    }

    /// `<flotilla> exec-task {job_dir}`: what every process of a job that runs the user's own
    /// program runs (see [`crate::user_task`]); `flotilla` is the running executable unless given.
    pub fn exec_task(flotilla: Option<&Path>) -> Result<TaskCommand, LaunchError> {
        let exe = match flotilla {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe()
                .map_err(|e| LaunchError::io("finding the flotilla executable", e))?,
        };
        Ok(TaskCommand::new([
            exe.as_os_str(),
            "exec-task".as_ref(),
            JOB_DIR_PLACEHOLDER.as_ref(),
        ]))
    }

    /// `<flotilla-train> train --run-dir {job_dir} --prepared`: the built-in training task,
    /// with the binary found by [`locate_train_binary`].
    pub fn train(settings: &settings::Settings) -> Result<TaskCommand, LaunchError> {
        Ok(TaskCommand::train_with(&locate_train_binary(settings)?))
    }

    /// The built-in training task run by the binary at `train_binary`.
    pub fn train_with(train_binary: &Path) -> TaskCommand {
        TaskCommand::new([
            train_binary.as_os_str(),
            "train".as_ref(),
            "--run-dir".as_ref(),
            JOB_DIR_PLACEHOLDER.as_ref(),
            "--prepared".as_ref(),
        ])
    }

    /// The argv for one job.
    pub fn for_job(&self, job_dir: &Path) -> Vec<OsString> {
        self.argv
            .iter()
            .map(|a| match a.to_str() {
                Some(s) if s.contains(JOB_DIR_PLACEHOLDER) => {
                    let dir = job_dir.as_os_str().to_string_lossy();
                    if s == JOB_DIR_PLACEHOLDER {
                        job_dir.as_os_str().to_os_string()
                    } else {
                        s.replace(JOB_DIR_PLACEHOLDER, &dir).into()
                    }
                }
                _ => a.clone(),
            })
            .collect()
    }
}

/// The last `n` lines of a file (reading at most its last 64 KiB).
pub fn log_tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(mut f) = File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if f.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0); // probably cut in the middle
    }
    let skip = lines.len().saturating_sub(n);
    lines[skip..].iter().map(|l| l.to_string()).collect()
}
