//! The SLURM launcher: renders `launchers/slurm.sbatch.j2` (or the user's `compute.template`)
//! with minijinja, submits it with `sbatch --parsable` and returns at once (fire and forget),
//! recording the job ids in the run's plan file (`sweep.json` / `job.json`).
//!
//! - A single run is one batch job; a sweep is one job array per group of jobs with the same
//!   `compute` config, split into several arrays when it is larger than the cluster's
//!   `MaxArraySize`. Array task `i` runs the `i`-th job directory listed in its script.
//! - Every value that reaches a shell goes through [`shell_quote`]; every value in an `#SBATCH`
//!   line through [`sbatch_quote`] (sbatch's own quoting; a newline is refused), so a config
//!   value such as `$(touch x)` is never executed.
//! - The batch shell traps `SIGUSR2` (sent `signal_delay_s` before the time limit with
//!   `--signal=B:USR2@N`, or by hand with `scancel --signal=USR2 --batch`), forwards it to the
//!   tasks, and when the step exits with [`REQUEUE_EXIT_CODE`] (the trainer checkpointed)
//!   requeues the job with `scontrol requeue`, at most `max_num_timeout` times. The requeued job
//!   resumes from its checkpoint (`trainer.resume: auto`).
//! - [`status`] asks `squeue` once for every job of a run (and `sacct` when the cluster has
//!   accounting), combines the answer with the run directory's own markers, and writes state
//!   changes back to the plan; a FAILED job gets its failing task's log tail as its message.
//! - `flotilla run --resume-sweep DIR` ([`super::resume`]) re-submits, through
//!   [`SlurmLauncher`], the jobs of a sweep that did not complete.

use super::{
    JobOutcome, LaunchError, Launcher, RankFailure, TaskCommand, TaskExit, JOB_DIR_PLACEHOLDER,
};
use crate::rundir::status::{locate, read_status, RunStatus};
use crate::rundir::{JobRecord, JobState, Plan, PlanFile, PreparedRun, RunDirError, LOGS_DIR};
use flotilla_config::schema::{ComputeConfig, TaskRanks};
use flotilla_contract::rank::{SLURM_PORT_BASE, SLURM_PORT_SPAN};
use minijinja::Environment;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The built-in sbatch template (`launchers/slurm.sbatch.j2`), compiled into the binary so that
/// `flotilla run` works from any directory.
pub const BUILTIN_TEMPLATE: &str = include_str!("../../../launchers/slurm.sbatch.j2");
/// The name the built-in template is known by (and its path in the repository).
pub const BUILTIN_TEMPLATE_NAME: &str = "launchers/slurm.sbatch.j2";
/// Exit status of a task that checkpointed after a stop signal (`EX_TEMPFAIL`): the batch
/// script requeues the job.
pub use crate::REQUEUE_EXIT_CODE;
/// The signal that asks a job to checkpoint and stop.
pub const STOP_SIGNAL: &str = "USR2";
/// Directory (inside the plan's directory) holding the rendered scripts and, for arrays, the
/// batch shell's first log lines before it switches to the job directory.
pub const SCRIPT_DIR: &str = "slurm";
/// File in a job's `logs/` where the batch script writes `<id> <STATE> <exit status>` when the
/// job ends (not when it requeues itself): what `status` falls back on once the scheduler no
/// longer knows the job.
pub use flotilla_contract::layout::SLURM_EXIT_MARKER as EXIT_MARKER;
/// `MaxArraySize` when `scontrol show config` cannot tell (Slurm's default).
pub const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;
/// Lines of a failing task's log kept in a FAILED job's message.
pub const LOG_TAIL_LINES: usize = 15;

/// What can go wrong while rendering, submitting or querying.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the sbatch template {}: {source}", path.display())]
    TemplateRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sbatch template {name}: {message}")]
    Template { name: String, message: String },
    #[error("compute.additional_parameters.{key}: {message}")]
    Parameter { key: String, message: String },
    #[error("{program} not found: run this on a SLURM login node (or use compute.launcher=local)")]
    CommandMissing { program: String },
    #[error("cannot run {program}: {source}")]
    CommandFailed {
        program: String,
        source: std::io::Error,
    },
    #[error("sbatch rejected {}: {stderr}{}", script.display(), submitted_note(.submitted))]
    Rejected {
        script: PathBuf,
        stderr: String,
        /// Ids of the arrays submitted before this one (already recorded in the plan).
        submitted: Vec<String>,
    },
    #[error("sbatch printed no job id for {} (output: '{output}')", script.display())]
    NoJobId { script: PathBuf, output: String },
    #[error("{command} failed: {stderr}")]
    Query { command: String, stderr: String },
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{}: not a sweep or run directory with a plan (sweep.json or job.json)", path.display())]
    NoPlan { path: PathBuf },
}

fn submitted_note(ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(
            " (already submitted and recorded: {}; `flotilla run --resume-sweep` submits the rest)",
            ids.join(", ")
        )
    }
}

fn io_err(path: &Path, source: std::io::Error) -> SlurmError {
    SlurmError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// quoting
// ---------------------------------------------------------------------------------------------

/// Characters that need no quoting, in a shell word or an sbatch value.
fn is_plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c)
}

/// A shell word that expands to exactly `s`: `s` itself when it only has plain characters,
/// otherwise single-quoted (`'` written as `'\''`). Nothing in it is ever expanded or executed.
/// Fails on a NUL byte, which no shell word can hold.
pub fn shell_quote(s: &str) -> Result<String, String> {
    if s.contains('\0') {
        return Err(format!("{s:?} contains a NUL byte"));
    }
    if !s.is_empty() && s.chars().all(is_plain) {
        return Ok(s.to_string());
    }
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

/// An `#SBATCH` option value that sbatch reads back as exactly `s`: plain values as they are,
/// anything else in double quotes with `\` and `"` escaped (sbatch's script parser honours
/// both). A line break (or NUL) is refused: it would end the `#SBATCH` line and start a shell
/// command.
pub fn sbatch_quote(s: &str) -> Result<String, String> {
    if s.contains(['\n', '\r', '\0']) {
        return Err(format!(
            "{s:?} contains a line break or NUL, which cannot appear in an #SBATCH line"
        ));
    }
    if !s.is_empty() && s.chars().all(is_plain) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// The task's argv as shell words, `{job_dir}` becoming `"$JOB_DIR"` (the batch script's
/// variable) and everything else quoted.
pub fn quote_task(argv: &[String]) -> Result<String, String> {
    if argv.is_empty() {
        return Err("the task command is empty".into());
    }
    let mut words = Vec::with_capacity(argv.len());
    for arg in argv {
        let mut word = String::new();
        for (i, part) in arg.split(JOB_DIR_PLACEHOLDER).enumerate() {
            if i > 0 {
                word.push_str("\"$JOB_DIR\"");
            }
            if !part.is_empty() {
                word.push_str(&shell_quote(part)?);
            }
        }
        if word.is_empty() {
            word.push_str("''");
        }
        words.push(word);
    }
    Ok(words.join(" "))
}

/// `%` doubled, so that sbatch/srun filename patterns keep a literal path.
fn escape_pattern(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

// ---------------------------------------------------------------------------------------------
// rendering
// ---------------------------------------------------------------------------------------------

/// `timeout_min` as sbatch's `D-HH:MM:SS`.
pub fn format_time(minutes: u64) -> String {
    let (days, rest) = (minutes / (24 * 60), minutes % (24 * 60));
    format!("{days}-{:02}:{:02}:00", rest / 60, rest % 60)
}

/// `compute.additional_parameters` as sbatch options: `key: value` → `--key=value` (`_` in a
/// key becomes `-`, as submitit does), `key: true` → `--key`, `false`/`null` → nothing.
pub fn sbatch_options(
    params: &indexmap::IndexMap<String, serde_json::Value>,
) -> Result<Vec<String>, SlurmError> {
    let mut out = Vec::new();
    for (key, value) in params {
        let bad = |message: String| SlurmError::Parameter {
            key: key.clone(),
            message,
        };
        let name_ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(bad(format!(
                "'{key}' is not an sbatch option name (letters, digits, '-' and '_')"
            )));
        }
        let flag = key.replace('_', "-");
        let text = match value {
            serde_json::Value::Null | serde_json::Value::Bool(false) => continue,
            serde_json::Value::Bool(true) => {
                out.push(format!("--{flag}"));
                continue;
            }
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::String(s) => s.clone(),
            other => {
                return Err(bad(format!(
                    "a list or dict ({other}) is not an sbatch option value; write it as a string"
                )))
            }
        };
        out.push(format!("--{flag}={}", sbatch_quote(&text).map_err(bad)?));
    }
    Ok(out)
}

/// Everything one rendered script needs.
#[derive(Clone, Debug)]
pub struct ScriptSpec<'a> {
    pub compute: &'a ComputeConfig,
    pub job_name: &'a str,
    /// What every task runs (normally `<flotilla> train --run-dir {job_dir} --prepared`, or
    /// `<flotilla> exec-task {job_dir}` for the user's own program).
    pub task: &'a TaskCommand,
    /// `None`: the built-in trainer; otherwise the user's program, started once per task or
    /// once per node. The user's program is requeued when it ends after the stop signal,
    /// whatever its exit status.
    pub ranks: Option<TaskRanks>,
    /// The job directories; a job array runs `job_dirs[SLURM_ARRAY_TASK_ID]`.
    pub job_dirs: &'a [PathBuf],
    /// The jobs' numbers, in the order of `job_dirs`.
    pub job_nums: &'a [usize],
    /// `true`: a job array over `job_dirs`; `false`: one job (`job_dirs` has one entry).
    pub array: bool,
    /// Where the scripts live; an array's batch shell logs here until it knows its job dir.
    pub script_dir: &'a Path,
}

/// The sbatch template named by `compute.template` (read from that path, relative to the
/// current directory), or the built-in one. Returns (name, text).
pub fn load_template(compute: &ComputeConfig) -> Result<(String, String), SlurmError> {
    match &compute.template {
        None => Ok((BUILTIN_TEMPLATE_NAME.into(), BUILTIN_TEMPLATE.into())),
        Some(path) => {
            let p = PathBuf::from(path);
            let text = std::fs::read_to_string(&p)
                .map_err(|source| SlurmError::TemplateRead { path: p, source })?;
            Ok((path.clone(), text))
        }
    }
}

/// Renders the sbatch script of `spec` with its template (see [`load_template`]).
pub fn render_script(spec: &ScriptSpec) -> Result<String, SlurmError> {
    let (name, text) = load_template(spec.compute)?;
    render_with(spec, &name, &text)
}

/// Renders `spec` with the template `text` (called `name` in error messages).
pub fn render_with(spec: &ScriptSpec, name: &str, text: &str) -> Result<String, SlurmError> {
    let tmpl_err = |e: minijinja::Error| SlurmError::Template {
        name: name.to_string(),
        message: format!("{e:#}"),
    };
    let c = spec.compute;
    let n = spec.job_dirs.len();
    if n == 0 || (!spec.array && n != 1) {
        return Err(SlurmError::Template {
            name: name.into(),
            message: format!("a script runs one job or an array of jobs, got {n} directories"),
        });
    }
    let array = spec.array.then(|| {
        let mut a = format!("0-{}", n - 1);
        if c.array_parallelism > 0 {
            a.push_str(&format!("%{}", c.array_parallelism));
        }
        a
    });
    let first = &spec.job_dirs[0];
    let (output, error) = if spec.array {
        let base = escape_pattern(spec.script_dir);
        (format!("{base}/%A_%a.out"), format!("{base}/%A_%a.err"))
    } else {
        let base = escape_pattern(&first.join(crate::rundir::LOGS_DIR));
        (
            format!("{base}/slurm-%j.out"),
            format!("{base}/slurm-%j.err"),
        )
    };
    let job_dirs: Vec<String> = spec
        .job_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let task_argv: Vec<String> = spec
        .task
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let task_command = quote_task(&task_argv).map_err(|message| SlurmError::Template {
        name: name.into(),
        message,
    })?;
    let ctx = minijinja::context! {
        job_name => spec.job_name,
        compute => minijinja::Value::from_serialize(c),
        time => format_time(c.timeout_min),
        array => array,
        sbatch_extra => sbatch_options(&c.additional_parameters)?,
        output => output,
        error => error,
        job_dirs => job_dirs,
        job_nums => spec.job_nums,
        task_argv => task_argv,
        task_command => task_command,
        user_task => spec.ranks.is_some(),
        per_node => spec.ranks == Some(TaskRanks::PerNode),
        signal => STOP_SIGNAL,
        requeue_exit_code => REQUEUE_EXIT_CODE,
        port_base => SLURM_PORT_BASE,
        port_span => SLURM_PORT_SPAN,
        flotilla_version => env!("CARGO_PKG_VERSION"),
        exit_marker => EXIT_MARKER,
    };
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    let filter = |f: fn(&str) -> Result<String, String>| {
        move |v: minijinja::Value| -> Result<String, minijinja::Error> {
            let s = match v.as_str() {
                Some(s) => s.to_string(),
                None => v.to_string(),
            };
            f(&s).map_err(|m| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, m))
        }
    };
    env.add_filter("shell_quote", filter(shell_quote));
    env.add_filter("sbatch_quote", filter(sbatch_quote));
    env.add_template(name, text).map_err(tmpl_err)?;
    env.get_template(name)
        .map_err(tmpl_err)?
        .render(ctx)
        .map_err(tmpl_err)
}

// ---------------------------------------------------------------------------------------------
// submission
// ---------------------------------------------------------------------------------------------

/// How to submit.
#[derive(Clone, Debug)]
pub struct SlurmOptions {
    /// What every task runs; `{job_dir}` stands for its job directory.
    pub task: TaskCommand,
    /// `--job-name`; `None`: `flotilla`.
    pub job_name: Option<String>,
    /// `MaxArraySize` to split arrays by; `None`: ask `scontrol show config`.
    pub max_array_size: Option<usize>,
    /// What the tasks of a job that runs the user's own program run; `None`: this
    /// executable's `exec-task` (see [`TaskCommand::exec_task`]).
    pub exec_task: Option<TaskCommand>,
}

impl SlurmOptions {
    /// Options whose tasks run `task`.
    pub fn with_task(task: TaskCommand) -> SlurmOptions {
        SlurmOptions {
            task,
            job_name: None,
            max_array_size: None,
            exec_task: None,
        }
    }
}

/// One job to submit.
#[derive(Clone, Debug)]
pub struct JobSpec {
    pub num: usize,
    /// The job directory (prepared: `config.yaml` inside).
    pub dir: PathBuf,
    pub compute: ComputeConfig,
    /// `None`: the built-in trainer; otherwise the user's program (see [`ScriptSpec::ranks`]).
    pub ranks: Option<TaskRanks>,
}

/// One rendered script: a batch job or a job array, not yet submitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Script {
    pub path: PathBuf,
    /// Whether it is a job array (task `i` runs `jobs[i]`).
    pub array: bool,
    /// The jobs it runs: (number, directory).
    pub jobs: Vec<(usize, PathBuf)>,
}

/// One `sbatch` call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Submission {
    pub script: PathBuf,
    /// The batch or array job id.
    pub job_id: String,
    pub jobs: Vec<SubmittedJob>,
}

/// One job of a [`Submission`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SubmittedJob {
    pub num: usize,
    pub dir: PathBuf,
    /// `<jobid>` or `<arrayid>_<task>`.
    pub job_id: String,
}

/// The jobs of a prepared run.
pub fn job_specs(run: &PreparedRun) -> Vec<JobSpec> {
    run.jobs
        .iter()
        .map(|j| JobSpec {
            num: j.num,
            dir: j.dir.clone(),
            compute: j.compute.clone(),
            ranks: j.task.as_ref().map(|t| t.ranks),
        })
        .collect()
}

/// Renders the scripts for `jobs` of the plan `plan` into `<plan dir>/slurm/submit-<k>.sbatch`
/// (never overwriting an older one): one batch job for a single run, job arrays for a sweep
/// (one per distinct `compute` config, split so that no array reaches `MaxArraySize`).
pub fn write_scripts(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
) -> Result<Vec<Script>, SlurmError> {
    write_scripts_as(plan, jobs, opts, plan.is_sweep())
}

/// [`write_scripts`] with one batch job per job (no arrays), also in a sweep: how an adaptive
/// study submits each trial alone.
pub fn write_single_scripts(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
) -> Result<Vec<Script>, SlurmError> {
    write_scripts_as(plan, jobs, opts, false)
}

fn write_scripts_as(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
    array: bool,
) -> Result<Vec<Script>, SlurmError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let max_array = if array {
        opts.max_array_size
            .unwrap_or_else(|| max_array_size().unwrap_or(DEFAULT_MAX_ARRAY_SIZE))
            .max(1)
    } else {
        1
    };
    // Group by compute config and task kind, keeping the jobs' order inside each group.
    let mut groups: Vec<(&ComputeConfig, Option<TaskRanks>, Vec<&JobSpec>)> = Vec::new();
    for job in jobs {
        match groups
            .iter_mut()
            .find(|(c, r, _)| **c == job.compute && *r == job.ranks)
        {
            Some((_, _, g)) => g.push(job),
            None => groups.push((&job.compute, job.ranks, vec![job])),
        }
    }
    let exec_task = match (&opts.exec_task, jobs.iter().any(|j| j.ranks.is_some())) {
        (Some(c), _) => Some(c.clone()),
        (None, true) => Some(
            TaskCommand::exec_task(None).map_err(|e| SlurmError::Template {
                name: "exec-task".into(),
                message: e.to_string(),
            })?,
        ),
        (None, false) => None,
    };
    // Jobs run wherever sbatch starts them: every path in a script is absolute.
    let absolute = |p: &Path| std::path::absolute(p).map_err(|e| io_err(p, e));
    let script_dir = absolute(&plan.dir().join(SCRIPT_DIR))?;
    std::fs::create_dir_all(&script_dir).map_err(|e| io_err(&script_dir, e))?;
    let recorded = plan.read().ok().and_then(|p| {
        p.extra
            .get(crate::rundir::JOB_NAME_KEY)
            .and_then(|v| v.as_str().map(str::to_string))
    });
    let job_name = opts
        .job_name
        .as_deref()
        .or(recorded.as_deref())
        .unwrap_or("flotilla");
    let mut out = Vec::new();
    for (compute, ranks, group) in groups {
        let task = match (ranks, &exec_task) {
            (Some(_), Some(exec_task)) => exec_task,
            _ => &opts.task,
        };
        for chunk in group.chunks(max_array) {
            let dirs = chunk
                .iter()
                .map(|j| absolute(&j.dir))
                .collect::<Result<Vec<PathBuf>, _>>()?;
            let nums: Vec<usize> = chunk.iter().map(|j| j.num).collect();
            let spec = ScriptSpec {
                compute,
                job_name,
                task,
                ranks,
                job_dirs: &dirs,
                job_nums: &nums,
                array,
                script_dir: &script_dir,
            };
            let text = render_script(&spec)?;
            out.push(Script {
                path: write_new_script(&script_dir, &text)?,
                array,
                jobs: nums.into_iter().zip(dirs).collect(),
            });
        }
    }
    Ok(out)
}

/// Submits rendered scripts with `sbatch --parsable`, recording each one's ids in the plan as
/// soon as its `sbatch` returns. Returns without waiting for the jobs (fire and forget).
pub fn submit_scripts(plan: &PlanFile, scripts: &[Script]) -> Result<Vec<Submission>, SlurmError> {
    let mut out: Vec<Submission> = Vec::new();
    for script in scripts {
        let submitted: Vec<String> = out.iter().map(|s| s.job_id.clone()).collect();
        let job_id = sbatch(&script.path, &submitted)?;
        let jobs = script
            .jobs
            .iter()
            .enumerate()
            .map(|(i, (num, dir))| SubmittedJob {
                num: *num,
                dir: dir.clone(),
                job_id: if script.array {
                    format!("{job_id}_{i}")
                } else {
                    job_id.clone()
                },
            })
            .collect();
        let submission = Submission {
            script: script.path.clone(),
            job_id,
            jobs,
        };
        record(plan, &submission)?;
        out.push(submission);
    }
    Ok(out)
}

/// [`write_scripts`] then [`submit_scripts`].
pub fn submit(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
) -> Result<Vec<Submission>, SlurmError> {
    let scripts = write_scripts(plan, jobs, opts)?;
    submit_scripts(plan, &scripts)
}

/// The SLURM launcher behind `compute.launcher=slurm`: [`Launcher::prepare`] writes the
/// scripts (also on `--dry-run`), [`Launcher::launch`] submits them and returns the PENDING
/// jobs with their ids.
#[derive(Clone, Debug)]
pub struct SlurmLauncher {
    opts: SlurmOptions,
    scripts: Vec<Script>,
}

impl SlurmLauncher {
    pub fn new(opts: SlurmOptions) -> SlurmLauncher {
        SlurmLauncher {
            opts,
            scripts: Vec::new(),
        }
    }

    /// The scripts written by the last [`Launcher::prepare`].
    pub fn scripts(&self) -> &[Script] {
        &self.scripts
    }
}

impl From<SlurmError> for LaunchError {
    fn from(e: SlurmError) -> Self {
        match e {
            SlurmError::RunDir(e) => LaunchError::RunDir(e),
            other => LaunchError::Launcher(other.to_string()),
        }
    }
}

impl Launcher for SlurmLauncher {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn prepare(&mut self, run: &PreparedRun) -> Result<(), LaunchError> {
        self.scripts = write_scripts(&run.plan, &job_specs(run), &self.opts)?;
        Ok(())
    }

    fn launch(&mut self, run: &PreparedRun) -> Result<Vec<JobOutcome>, LaunchError> {
        if self.scripts.is_empty() {
            self.prepare(run)?;
        }
        let submissions = submit_scripts(&run.plan, &self.scripts)?;
        let ids: HashMap<usize, String> = submissions
            .iter()
            .flat_map(|s| s.jobs.iter().map(|j| (j.num, j.job_id.clone())))
            .collect();
        Ok(run
            .jobs
            .iter()
            .map(|j| {
                let mut o = JobOutcome::pending(j);
                o.job_id = ids.get(&j.num).cloned();
                o
            })
            .collect())
    }
}

/// Writes `text` to a new `submit-<k>.sbatch` in `dir` (never overwriting an older script).
fn write_new_script(dir: &Path, text: &str) -> Result<PathBuf, SlurmError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for k in 0.. {
        let path = dir.join(format!("submit-{k}.sbatch"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(text.as_bytes()).map_err(|e| io_err(&path, e))?;
                return Ok(path);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&path, e)),
        }
    }
    unreachable!("an unbounded range ends only by returning")
}

/// Runs a Slurm client command, mapping a missing program to [`SlurmError::CommandMissing`].
fn run_command(program: &str, args: &[&str]) -> Result<std::process::Output, SlurmError> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| {
            if source.kind() == ErrorKind::NotFound {
                SlurmError::CommandMissing {
                    program: program.into(),
                }
            } else {
                SlurmError::CommandFailed {
                    program: program.into(),
                    source,
                }
            }
        })
}

/// `sbatch --parsable SCRIPT`: the job id.
fn sbatch(script: &Path, submitted: &[String]) -> Result<String, SlurmError> {
    let script_arg = script.display().to_string();
    let out = run_command("sbatch", &["--parsable", &script_arg])?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(SlurmError::Rejected {
            script: script.to_path_buf(),
            stderr: if stderr.is_empty() {
                format!("exit status {}", out.status)
            } else {
                stderr
            },
            submitted: submitted.to_vec(),
        });
    }
    // `--parsable` prints `<jobid>` or `<jobid>;<cluster>`.
    let id = stdout
        .lines()
        .last()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(SlurmError::NoJobId {
            script: script.to_path_buf(),
            output: stdout,
        });
    }
    Ok(id.to_string())
}

/// `scancel ARGS... ID`: asks the scheduler to signal or cancel a job (`--signal=TERM` first,
/// then a plain cancel, is how a study stops a pruned trial).
pub fn scancel(id: &str, args: &[&str]) -> Result<(), SlurmError> {
    let mut all: Vec<&str> = args.to_vec();
    all.push(id);
    let out = run_command("scancel", &all)?;
    if !out.status.success() {
        return Err(SlurmError::Query {
            command: format!("scancel {}", all.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Records a submission's ids in the plan (jobs PENDING, message cleared) and lists the
/// submission under the plan's `slurm.submissions`.
fn record(plan: &PlanFile, s: &Submission) -> Result<(), SlurmError> {
    let nums: Vec<usize> = s.jobs.iter().map(|j| j.num).collect();
    plan.update(|p| {
        for job in &s.jobs {
            if let Some(rec) = p.job_mut(job.num) {
                rec.job_id = Some(job.job_id.clone());
                rec.set_state(JobState::Pending, None);
            }
        }
        let slurm = p
            .extra
            .entry("slurm")
            .or_insert_with(|| serde_json::json!({ "submissions": [] }));
        if let Some(list) = slurm.get_mut("submissions").and_then(|l| l.as_array_mut()) {
            list.push(serde_json::json!({
                "job_id": s.job_id,
                "script": s.script,
                "jobs": nums,
                "time": chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, false),
            }));
        }
    })?;
    Ok(())
}

/// The cluster's `MaxArraySize` (`scontrol show config`): an array's indices must stay below it.
pub fn max_array_size() -> Result<usize, SlurmError> {
    let out = run_command("scontrol", &["show", "config"])?;
    if !out.status.success() {
        return Err(SlurmError::Query {
            command: "scontrol show config".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(parse_max_array_size(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or(DEFAULT_MAX_ARRAY_SIZE))
}

/// `MaxArraySize = N` from `scontrol show config` output.
pub fn parse_max_array_size(text: &str) -> Option<usize> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "MaxArraySize").then(|| v.trim().parse().ok())?
    })
}

// ---------------------------------------------------------------------------------------------
// status
// ---------------------------------------------------------------------------------------------

/// What the scheduler says about one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveJob {
    pub state: JobState,
    /// The scheduler's own word (`PENDING`, `COMPLETING`, `CANCELLED by 0`, ...).
    pub raw: String,
    /// squeue's reason (`None`, `JobArrayTaskLimit`, `BeginTime`, ...), if any.
    pub reason: Option<String>,
}

/// The array or job id an id belongs to (`123_4` → `123`).
fn base_id(id: &str) -> &str {
    id.split('_').next().unwrap_or(id)
}

/// Expands squeue's `%i` (`12`, `12_3`, `12_[1-3,7%2]`) into single ids.
pub fn expand_ids(field: &str) -> Vec<String> {
    let Some((base, rest)) = field.split_once('_') else {
        return vec![field.to_string()];
    };
    let Some(inner) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else {
        return vec![field.to_string()];
    };
    let inner = inner.split('%').next().unwrap_or("");
    let mut out = Vec::new();
    for part in inner.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u64>(), hi.trim().parse::<u64>()) {
            // A bound on the expansion: arrays are never this large.
            if hi >= lo && hi - lo < 10_000_000 {
                out.extend((lo..=hi).map(|i| format!("{base}_{i}")));
            }
        }
    }
    out
}

/// Parses `squeue -h -o '%i|%T|%r'` output.
pub fn parse_squeue(text: &str) -> HashMap<String, LiveJob> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut f = line.split('|');
        let (Some(id), Some(state)) = (f.next(), f.next()) else {
            continue;
        };
        let reason = f
            .next()
            .map(str::trim)
            .filter(|r| !r.is_empty() && *r != "None")
            .map(str::to_string);
        let live = LiveJob {
            state: JobState::from_slurm(state),
            raw: state.trim().to_string(),
            reason,
        };
        for id in expand_ids(id.trim()) {
            out.insert(id, live.clone());
        }
    }
    out
}

/// Parses `sacct -n -P -X -o JobID,State` output.
pub fn parse_sacct(text: &str) -> HashMap<String, LiveJob> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some((id, state)) = line.split_once('|') else {
            continue;
        };
        let state = state.split('|').next().unwrap_or("").trim();
        for id in expand_ids(id.trim()) {
            out.insert(
                id,
                LiveJob {
                    state: JobState::from_slurm(state),
                    raw: state.to_string(),
                    reason: None,
                },
            );
        }
    }
    out
}

/// Asks the scheduler about `ids` (`<jobid>` or `<arrayid>_<task>`): one `squeue` call for all
/// of them (finished jobs stay visible for `MinJobAge`), then one `sacct` call for those squeue
/// no longer knows, when the cluster keeps accounting (a failing `sacct` is ignored). Ids the
/// scheduler does not know are left out.
pub fn query(ids: &[String]) -> Result<HashMap<String, LiveJob>, SlurmError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let mut bases: Vec<&str> = ids.iter().map(|i| base_id(i)).collect();
    bases.sort_unstable();
    bases.dedup();
    let list = bases.join(",");
    let out = run_command(
        "squeue",
        &["-j", &list, "-t", "all", "-h", "-o", "%i|%T|%r"],
    )?;
    let mut found = if out.status.success() {
        parse_squeue(&String::from_utf8_lossy(&out.stdout))
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        // Every id purged (older than MinJobAge): squeue refuses the whole list.
        if !stderr.contains("Invalid job id") {
            return Err(SlurmError::Query {
                command: "squeue".into(),
                stderr,
            });
        }
        HashMap::new()
    };
    let missing: Vec<&str> = ids
        .iter()
        .filter(|i| !found.contains_key(*i))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        let list = missing.join(",");
        if let Ok(out) = run_command(
            "sacct",
            &["-j", &list, "-n", "-P", "-X", "-o", "JobID,State"],
        ) {
            if out.status.success() {
                for (id, live) in parse_sacct(&String::from_utf8_lossy(&out.stdout)) {
                    found.entry(id).or_insert(live);
                }
            }
        }
    }
    Ok(found)
}

/// The scheduler's states of a plan's jobs, by job number (one batched [`query`]); jobs without
/// an id or unknown to the scheduler are left out.
pub fn live_states(plan: &Plan) -> Result<HashMap<usize, JobState>, SlurmError> {
    let ids: Vec<String> = plan.jobs.iter().filter_map(|j| j.job_id.clone()).collect();
    let live = query(&ids)?;
    Ok(plan
        .jobs
        .iter()
        .filter_map(|j| Some((j.num, live.get(j.job_id.as_ref()?)?.state)))
        .collect())
}

/// The status of a run or sweep directory (or one job directory of a sweep): the plan's
/// records, the scheduler's live states (one batched query) and the directories' markers. State
/// changes are written back to the plan; a newly FAILED job gets its log tail as message. When
/// `squeue` is not installed or fails (controller down), only the directories are consulted
/// (with a warning in the latter case).
pub fn status(dir: &Path) -> Result<RunStatus, SlurmError> {
    let located = locate(dir)?;
    let Some(plan_file) = located.plan else {
        return Ok(read_status(dir, &|_| None)?);
    };
    let plan = plan_file.read()?;
    let ids: Vec<String> = plan
        .jobs
        .iter()
        .filter(|j| located.only.is_none_or(|n| n == j.num))
        .filter_map(|j| j.job_id.clone())
        .collect();
    // `None`: squeue is not installed here; only the directories can tell.
    let live = match query(&ids) {
        Ok(live) => Some(live),
        Err(SlurmError::CommandMissing { .. }) => None,
        // The controller is unreachable (or refuses): say so, and show what the directories
        // and the plan record rather than nothing.
        Err(e @ SlurmError::Query { .. }) => {
            tracing::warn!("{e}; showing the states the run directories record");
            None
        }
        Err(e) => return Err(e),
    };
    let lookup = |j: &JobRecord| -> Option<JobState> {
        let id = j.job_id.as_ref()?;
        if let Some(l) = live.as_ref().and_then(|live| live.get(id)) {
            return Some(l.state);
        }
        match (&live, exit_marker(&plan_file.job_dir(j), id)) {
            (_, Some(state)) => Some(state),
            // Submitted, and the scheduler has forgotten it without a word from the job.
            (Some(_), None) if !j.state.is_terminal() => Some(JobState::Unknown),
            _ => None,
        }
    };
    let mut status = read_status(dir, &lookup)?;

    // Write changes back, with a log tail for failures.
    let mut changes: BTreeMap<usize, (JobState, Option<String>)> = BTreeMap::new();
    for js in &mut status.jobs {
        let Some(recorded) = js.recorded else {
            continue;
        };
        if js.state == recorded {
            continue;
        }
        let message = match js.state {
            JobState::Failed | JobState::OutOfMemory | JobState::NodeFail | JobState::Timeout => {
                failure_message(&js.dir)
            }
            _ => None,
        };
        js.message = message.clone();
        changes.insert(js.num, (js.state, message));
    }
    if !changes.is_empty() {
        plan_file.update(|p| {
            for (num, (state, message)) in &changes {
                if let Some(rec) = p.job_mut(*num) {
                    rec.set_state(*state, message.clone());
                }
            }
        })?;
    }
    Ok(status)
}

/// The state the batch script recorded in `JOB_DIR/logs/slurm.exit` for the job `id`, if any.
pub fn exit_marker(job_dir: &Path, id: &str) -> Option<JobState> {
    let text = std::fs::read_to_string(job_dir.join(LOGS_DIR).join(EXIT_MARKER)).ok()?;
    let mut words = text.split_whitespace();
    (words.next()? == id).then(|| JobState::from_slurm(words.next().unwrap_or("")))
}

/// Why a job failed, from its logs: the task srun reported (`srun: error: HOST: task 1: Exited
/// with exit code 3` in the batch log), its exit status and the last lines of its
/// `logs/rank_<R>.log`; without such a line, the last lines of the batch log.
pub fn failure_message(job_dir: &Path) -> Option<String> {
    let logs = job_dir.join(LOGS_DIR);
    let newest = |suffix: &str| -> Option<PathBuf> {
        std::fs::read_dir(&logs)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("slurm-") && n.ends_with(suffix)
            })
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .map(|e| e.path())
    };
    let err_log = newest(".err");
    let out_log = newest(".out");
    let err_tail = err_log
        .as_deref()
        .map(|p| super::local::log_tail(p, 200))
        .unwrap_or_default();
    if let Some((rank, exit)) = err_tail.iter().rev().find_map(|l| parse_srun_error(l)) {
        let log = logs.join(flotilla_contract::layout::rank_log_name(rank));
        let tail = super::local::log_tail(&log, LOG_TAIL_LINES);
        return Some(
            RankFailure {
                rank,
                exit,
                log,
                tail,
            }
            .to_string(),
        );
    }
    for log in [err_log, out_log].into_iter().flatten() {
        let tail = super::local::log_tail(&log, LOG_TAIL_LINES);
        if !tail.is_empty() {
            let lines: Vec<String> = tail.iter().map(|l| format!("  | {l}")).collect();
            return Some(format!(
                "last lines of {}:\n{}",
                log.display(),
                lines.join("\n")
            ));
        }
    }
    None
}

/// `srun: error: HOST: task 1: Exited with exit code 3` (or `tasks 0-1: Killed by signal 9`)
/// → the first task named and how it ended.
pub fn parse_srun_error(line: &str) -> Option<(usize, TaskExit)> {
    let rest = line.strip_prefix("srun: error: ")?;
    let i = rest.find(": task")?;
    let (tasks, what) = rest[i + 2..].split_once(": ")?;
    let rank = tasks
        .trim_start_matches("tasks")
        .trim_start_matches("task")
        .trim()
        .split(['-', ','])
        .next()?
        .parse::<usize>()
        .ok()?;
    let number = |prefix: &str| what.trim().strip_prefix(prefix)?.trim().parse::<i32>().ok();
    let exit = if let Some(c) = number("Exited with exit code") {
        TaskExit::Code(c)
    } else if let Some(sig) = number("Killed by signal") {
        TaskExit::Signal(sig)
    } else {
        return None;
    };
    Some((rank, exit))
}
