//! Launching prepared jobs: the [`Launcher`] trait every launcher implements, the outcome of a
//! job ([`JobOutcome`], [`RankFailure`]), the task each rank runs ([`TaskCommand`]), and the
//! two commands built on them: [`run`] (prepare the directories, then start or submit) and
//! [`status`] (recorded state + directory markers + the launcher's live view).
//!
//! The local launcher lives in [`local`]; the SLURM launcher in `slurm` plugs in through
//! [`launcher_for`] (start/submit) and [`live_states`] (batched squeue/sacct query).

pub mod local;
pub mod memory;
pub mod rundir;
pub mod settings;
pub mod slurm;
pub mod study;
pub mod task;

/// The exit status of a task that stopped on request after writing a checkpoint.
pub use flotilla_contract::exit::REQUEUE as REQUEUE_EXIT_CODE;

use crate::rundir::status::{read_status, RunStatus};
use crate::rundir::{JobState, Plan, PreparedRun, RunDirError, RunRequest};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::{Composer, ConfigError};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

pub use local::{Cancel, LocalLauncher, LocalOptions};

/// Anything that goes wrong while starting, supervising or querying jobs.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("job {num}: cannot start rank {rank} ({program}): {error}")]
    Spawn {
        num: usize,
        rank: usize,
        program: String,
        error: std::io::Error,
    },
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    /// A launcher that cannot do what the config asks.
    #[error("{0}")]
    Unsupported(String),
    /// The training task binary cannot be found; the message says where it looked and the fix.
    #[error("{0}")]
    TaskBinary(String),
    /// A launcher's own failure (e.g. `sbatch` refusing a script), with its message.
    #[error("{0}")]
    Launcher(String),
    /// A job's `task.json` cannot be read.
    #[error("{0}")]
    Task(String),
}

impl From<ConfigError> for LaunchError {
    fn from(e: ConfigError) -> Self {
        LaunchError::RunDir(RunDirError::Config(e))
    }
}

impl LaunchError {
    /// The config error behind this failure, when the config or an override is at fault.
    pub fn as_config(&self) -> Option<&ConfigError> {
        match self {
            LaunchError::RunDir(RunDirError::Config(e)) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn io(what: impl Into<String>, error: std::io::Error) -> LaunchError {
        LaunchError::Io {
            what: what.into(),
            error,
        }
    }
}

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
    /// program runs (see [`task`]); `flotilla` is the running executable unless given.
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

/// The file name of the training task binary.
pub const TRAIN_BINARY_NAME: &str = "flotilla-train";

/// Finds the training task binary: the `train_binary` setting (a settings file or
/// `FLOTILLA_TRAIN_BINARY`) when set, else `flotilla-train` beside the running executable, else
/// `flotilla-train` on `PATH`. The error says where it looked and how to provide it.
pub fn locate_train_binary(settings: &settings::Settings) -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe().ok();
    let path = std::env::var_os("PATH");
    locate_train_binary_in(
        settings.train_binary.clone(),
        exe.as_deref().and_then(Path::parent),
        path.as_deref(),
    )
}

/// [`locate_train_binary`] over explicit inputs: an explicit path, the directory of the
/// running executable, and a `PATH` value.
pub fn locate_train_binary_in(
    explicit: Option<PathBuf>,
    beside: Option<&Path>,
    search_path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, LaunchError> {
    if let Some(explicit) = explicit {
        return if is_executable_file(&explicit) {
            Ok(explicit)
        } else {
            Err(LaunchError::TaskBinary(format!(
                "the train_binary setting {} is not an executable file; point it (in a settings \
                 file or FLOTILLA_TRAIN_BINARY) at the `{TRAIN_BINARY_NAME}` binary, built by \
                 `cargo build --release -p flotilla-train`",
                explicit.display()
            )))
        };
    }
    let mut looked = Vec::new();
    if let Some(dir) = beside {
        let candidate = dir.join(TRAIN_BINARY_NAME);
        if is_executable_file(&candidate) {
            return Ok(candidate);
        }
        looked.push(dir.display().to_string());
    }
    if let Some(search_path) = search_path {
        for dir in std::env::split_paths(search_path) {
            let candidate = dir.join(TRAIN_BINARY_NAME);
            if is_executable_file(&candidate) {
                return Ok(candidate);
            }
        }
        looked.push("PATH".to_string());
    }
    Err(LaunchError::TaskBinary(format!(
        "the training task `{TRAIN_BINARY_NAME}` was not found (looked in {}); build it with \
         `cargo build --release -p flotilla-train` (it goes beside `flotilla`), or set \
         `train_binary` in a settings file or FLOTILLA_TRAIN_BINARY to its path",
        looked.join(" and ")
    )))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
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

/// The launcher's live view of a plan's jobs (by job number), for `flotilla status`: the local
/// launcher reports jobs whose `flotilla run` is gone; SLURM asks squeue/sacct once for all ids.
pub fn live_states(plan: &Plan) -> Result<HashMap<usize, JobState>, LaunchError> {
    match plan.launcher.as_str() {
        "local" => Ok(local::live_states(plan)),
        "slurm" => Ok(slurm::live_states(plan)?),
        _ => Ok(HashMap::new()),
    }
}

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
    let prepared = rundir::prepare(composer, req)?;
    let mut launcher = launcher_for(prepared.launcher, opts.local)?;
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
    let task = task::TaskSpec::read(&dir).map_err(|e| LaunchError::Task(e.to_string()))?;
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
    let kind = match plan.launcher.as_str() {
        "slurm" => LauncherKind::Slurm,
        _ => LauncherKind::Local,
    };
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
                matches!(
                    js.state,
                    JobState::Pending | JobState::Running | JobState::Requeued
                ) && rec.job_id.is_some()
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

/// `flotilla status DIR`: every job of a run or sweep directory (or the one job of a job
/// directory inside a sweep), its recorded state corrected by the launcher's live view and by
/// the directory's markers.
pub fn status(dir: &Path) -> Result<RunStatus, LaunchError> {
    let located = rundir::status::locate(dir)?;
    let live = match &located.plan {
        Some(p) => {
            let plan = p.read()?;
            if plan.launcher == "slurm" {
                // One batched squeue/sacct query; state changes are written back to the plan.
                return Ok(slurm::status(dir)?);
            }
            live_states(&plan)?
        }
        None => HashMap::new(),
    };
    Ok(read_status(dir, &|j| live.get(&j.num).copied())?)
}

/// A table for people.
pub fn status_text(st: &RunStatus) -> String {
    let mut counts: Vec<(JobState, usize)> = Vec::new();
    for j in &st.jobs {
        match counts.iter_mut().find(|(s, _)| *s == j.state) {
            Some((_, c)) => *c += 1,
            None => counts.push((j.state, 1)),
        }
    }
    let summary: Vec<String> = counts.iter().map(|(s, c)| format!("{c} {s}")).collect();
    let what = match (&st.sweep_dir, st.jobs.len()) {
        (Some(d), n) if n > 1 || d != &st.dir => format!("sweep {}", d.display()),
        _ => format!("run {}", st.dir.display()),
    };
    let mut out = format!(
        "{what} [{}]: {}\n",
        st.launcher.as_deref().unwrap_or("unknown launcher"),
        summary.join(", ")
    );
    out.push_str(&format!(
        "{:>5}  {:<13} {:<12} {:>8}  {}\n",
        "job", "state", "job id", "steps", "dir"
    ));
    for j in &st.jobs {
        out.push_str(&format!(
            "{:>5}  {:<13} {:<12} {:>8}  {}{}\n",
            j.num,
            j.state.as_str(),
            j.job_id.as_deref().unwrap_or("-"),
            j.steps.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            j.dir.display(),
            if j.final_model { "  (final/)" } else { "" }
        ));
        if let Some(m) = &j.message {
            for line in m.lines() {
                out.push_str(&format!("         {line}\n"));
            }
        }
    }
    out
}

/// The status as JSON: `{"dir", "sweep_dir", "launcher", "jobs": [{"num", "dir", "job_id",
/// "state", "recorded", "steps", "final_model", "message"}]}`.
pub fn status_json(st: &RunStatus) -> String {
    let mut s = serde_json::to_string(st).expect("status serialises");
    s.push('\n');
    s
}
