//! Submitting: [`write_scripts`] renders the scripts of a run's jobs into
//! `<plan dir>/slurm/submit-<k>.sbatch` (one batch job for a single run, job arrays for a sweep,
//! split by `compute` config, task kind and the cluster's `MaxArraySize` as
//! [`super::batches::plan_batches`] decides), and [`submit_scripts`] hands
//! them to `sbatch --parsable`, recording every job id in the plan as soon as its `sbatch`
//! returns. Nothing waits for the jobs (fire and forget).

use super::batches::{plan_batches, BatchJob, BatchKind, Submit};
use super::error::io_err;
use super::render::{render_script, ScriptSpec};
use super::{run_command, SlurmError};
use crate::rundir::{JobState, PlanFile, PreparedRun};
use crate::TaskCommand;
use flotilla_config::schema::{ComputeConfig, TaskRanks};
use serde::Serialize;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Directory (inside the plan's directory) holding the rendered scripts and, for arrays, the
/// batch shell's first log lines before it switches to the job directory.
pub const SCRIPT_DIR: &str = "slurm";
/// `MaxArraySize` when `scontrol show config` cannot tell (Slurm's default).
pub const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;

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
    /// `sbatch --dependency=...` for every submission (`flotilla run --after`).
    pub dependency: Option<String>,
}

impl SlurmOptions {
    /// Options whose tasks run `task`.
    pub fn with_task(task: TaskCommand) -> SlurmOptions {
        SlurmOptions {
            task,
            job_name: None,
            max_array_size: None,
            exec_task: None,
            dependency: None,
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
    /// Whether it is an array of packed allocations sharing the queue of `jobs`
    /// (`compute.pack`, see [`super::pack`]).
    pub packed: bool,
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

impl BatchJob for JobSpec {
    fn num(&self) -> usize {
        self.num
    }
    fn compute(&self) -> &ComputeConfig {
        &self.compute
    }
    fn ranks(&self) -> Option<TaskRanks> {
        self.ranks
    }
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
    write_scripts_as(plan, jobs, opts, plan.is_sweep(), false)
}

/// [`write_scripts`] with one batch job per job (no arrays), also in a sweep: how an adaptive
/// study submits each trial alone.
pub fn write_single_scripts(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
) -> Result<Vec<Script>, SlurmError> {
    write_scripts_as(plan, jobs, opts, false, true)
}

/// `array`: a sweep's jobs go in job arrays (or packed allocations); `adaptive`: the trials of
/// an adaptive study, submitted one at a time, which cannot be packed. A single run's one job is
/// never packed. What each script holds is [`plan_batches`]'s decision, which `flotilla plan`
/// prints.
fn write_scripts_as(
    plan: &PlanFile,
    jobs: &[JobSpec],
    opts: &SlurmOptions,
    array: bool,
    adaptive: bool,
) -> Result<Vec<Script>, SlurmError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let how = if array {
        Submit::Arrays {
            max_array_size: opts
                .max_array_size
                .unwrap_or_else(|| max_array_size().unwrap_or(DEFAULT_MAX_ARRAY_SIZE)),
        }
    } else {
        Submit::Singles { adaptive }
    };
    let batches = plan_batches(jobs, how)?;
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
    for batch in batches {
        let task = match (batch.ranks, &exec_task) {
            (Some(_), Some(exec_task)) => exec_task,
            _ => &opts.task,
        };
        let dirs = batch
            .jobs
            .iter()
            .map(|j| absolute(&j.dir))
            .collect::<Result<Vec<PathBuf>, _>>()?;
        let nums: Vec<usize> = batch.jobs.iter().map(|j| j.num).collect();
        let (path, is_array, packed) = match &batch.kind {
            BatchKind::Packed(shape) => {
                let path = super::pack::write_pack_script(
                    plan,
                    batch.compute,
                    shape,
                    batch.ranks,
                    task,
                    &nums,
                    job_name,
                    &script_dir,
                )?;
                (path, true, true)
            }
            kind => {
                let is_array = *kind == BatchKind::Array;
                let spec = ScriptSpec {
                    compute: batch.compute,
                    job_name,
                    task,
                    ranks: batch.ranks,
                    job_dirs: &dirs,
                    job_nums: &nums,
                    array: is_array,
                    script_dir: &script_dir,
                };
                let text = render_script(&spec)?;
                (write_new_script(&script_dir, &text)?, is_array, false)
            }
        };
        out.push(Script {
            path,
            array: is_array,
            packed,
            jobs: nums.into_iter().zip(dirs).collect(),
        });
    }
    Ok(out)
}

/// Submits rendered scripts with `sbatch --parsable`, recording each one's ids in the plan as
/// soon as its `sbatch` returns. Returns without waiting for the jobs (fire and forget).
pub fn submit_scripts(plan: &PlanFile, scripts: &[Script]) -> Result<Vec<Submission>, SlurmError> {
    submit_scripts_after(plan, scripts, None)
}

/// [`submit_scripts`] with `sbatch --dependency=DEPENDENCY` (e.g. `afterok:12:13_0`): the jobs
/// start only once the scheduler sees the dependency satisfied.
pub fn submit_scripts_after(
    plan: &PlanFile,
    scripts: &[Script],
    dependency: Option<&str>,
) -> Result<Vec<Submission>, SlurmError> {
    let mut out: Vec<Submission> = Vec::new();
    for script in scripts {
        let submitted: Vec<String> = out.iter().map(|s| s.job_id.clone()).collect();
        let job_id = sbatch(&script.path, &submitted, dependency)?;
        let jobs = script
            .jobs
            .iter()
            .enumerate()
            .map(|(i, (num, dir))| SubmittedJob {
                num: *num,
                dir: dir.clone(),
                job_id: if script.packed {
                    job_id.clone()
                } else if script.array {
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
        record(plan, &submission, script.packed)?;
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

/// Writes `text` to a new `submit-<k>.sbatch` in `dir` (never overwriting an older script).
pub(super) fn write_new_script(dir: &Path, text: &str) -> Result<PathBuf, SlurmError> {
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

/// `sbatch --parsable SCRIPT`: the job id.
fn sbatch(
    script: &Path,
    submitted: &[String],
    dependency: Option<&str>,
) -> Result<String, SlurmError> {
    let script_arg = script.display().to_string();
    let mut args = vec!["--parsable".to_string()];
    if let Some(d) = dependency {
        args.push(format!("--dependency={d}"));
    }
    args.push(script_arg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_command("sbatch", &args)?;
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

/// Records a submission's ids in the plan (jobs PENDING, message cleared) and lists the
/// submission under the plan's `slurm.submissions`.
/// A packed job gets no id of its own until an allocation claims it; its record names the
/// array of allocations instead.
fn record(plan: &PlanFile, s: &Submission, packed: bool) -> Result<(), SlurmError> {
    let nums: Vec<usize> = s.jobs.iter().map(|j| j.num).collect();
    plan.update(|p| {
        for job in &s.jobs {
            if let Some(rec) = p.job_mut(job.num) {
                if packed {
                    rec.job_id = None;
                    rec.extra.remove(super::pack::ALLOCATION_KEY);
                    rec.extra.remove(super::pack::STEP_KEY);
                    rec.extra.insert(
                        super::pack::PACK_ARRAY_KEY.into(),
                        serde_json::Value::from(job.job_id.clone()),
                    );
                } else {
                    rec.job_id = Some(job.job_id.clone());
                    rec.extra.remove(super::pack::PACK_ARRAY_KEY);
                }
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
                "packed": packed,
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
