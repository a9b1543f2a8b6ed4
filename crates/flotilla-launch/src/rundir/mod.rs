//! Run directories: one directory per job, created atomically and never shared or overwritten.
//!
//! This module owns the layout of a job directory (`config.yaml`, `overrides.yaml`,
//! `meta.json`, `task.json` for the user's own program ([`task`]), `logs/`; later the
//! trainer's `metrics.csv`, `checkpoints/`, `final/`), the sweep directory (`sweep.json` plus
//! one sub-directory per job), the single run's `job.json`, and the way they come to exist:
//! [`prepare`] composes and validates every job first, builds the whole tree in a hidden
//! temporary directory next to its destination, then claims the destination name with `mkdir`
//! (which fails when the name exists, so two commands started in the same second get `<dir>`
//! and `<dir>_1`) and renames the tree onto it. Directory names come from the runtime node:
//! `flotilla.run.dir` for one run, `flotilla.sweep.dir` + `flotilla.sweep.subdir` for a sweep.

pub mod meta;
pub mod plan;
pub mod snapshot;
pub mod status;
pub mod task;
pub mod trials;

pub use meta::{ComposeSource, Meta, Provenance};
pub use plan::{JobRecord, JobState, Plan, PlanFile, JOB_FILE, PLAN_VERSION, STEP_KEY, SWEEP_FILE};
pub use task::{HydraJob, TaskError, TaskSpec, TASK_FILE};

use flotilla_config::interp::{self, ResolveContext};
use flotilla_config::node::{python_str, Node, Value};
use flotilla_config::schema::{ComputeConfig, JobConfig};
use flotilla_config::sweep::{plan_each, SweepFile};
use flotilla_config::yaml::{to_yaml, EmitOptions};
use flotilla_config::{Composed, Composer, ConfigError, RUNTIME_KEYS};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

/// Files of a job directory.
pub use flotilla_contract::layout::{
    load_job_config_tree, override_assignments, overrides_yaml, read_overrides, CONFIG_FILE,
    LOGS_DIR, META_FILE, OVERRIDES_FILE,
};

/// How many `_N` suffixes [`install_dir`] tries before giving up.
const MAX_SUFFIX: usize = 100_000;

/// Anything that goes wrong while preparing or reading run directories.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// The config or an override is at fault (exit status 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: invalid JSON: {error}", path.display())]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{}: no job {num} in this plan", path.display())]
    NoSuchJob { num: usize, path: PathBuf },
    #[error("{}: not a run directory (no sweep.json, job.json or meta.json)", path.display())]
    NotARunDir { path: PathBuf },
    #[error("{}: cannot compose this job again: {why}", path.display())]
    NotReplayable { path: PathBuf, why: String },
}

pub(crate) fn io_err(path: &Path, error: std::io::Error) -> RunDirError {
    RunDirError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The current local time, RFC 3339 with seconds.
pub(crate) fn now_rfc3339() -> String {
    chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, flushed to disk,
/// then renamed over `path`. Readers see the old or the new content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), unique()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, e));
    }
    Ok(())
}

/// A number unique within this process.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Candidate names for a destination: `dir`, `dir_1`, `dir_2`, ...
pub fn candidate(dir: &Path, n: usize) -> PathBuf {
    if n == 0 {
        return dir.to_path_buf();
    }
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!("_{n}"));
    dir.with_file_name(name)
}

/// Creates a fresh, empty directory at `dir` (or `dir_1`, `dir_2`, ... when taken; parents are
/// created) and returns its path. `mkdir` is atomic, so concurrent callers never get the same
/// directory, and an existing directory is never reused.
pub fn create_unique_dir(dir: &Path) -> Result<PathBuf, RunDirError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    }
    for n in 0..MAX_SUFFIX {
        let path = candidate(dir, n);
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&path, e)),
        }
    }
    Err(io_err(
        dir,
        std::io::Error::other(format!("{MAX_SUFFIX} directories with this name exist")),
    ))
}

/// A hidden directory next to `dest` to build its content in (same file system, so that the
/// final rename is atomic). Parents of `dest` are created.
pub fn staging_dir(dest: &Path) -> Result<PathBuf, RunDirError> {
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    let base = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = parent.join(format!(
        ".{base}.flotilla-tmp.{}.{nanos}.{}",
        std::process::id(),
        unique()
    ));
    std::fs::create_dir(&tmp).map_err(|e| io_err(&tmp, e))?;
    Ok(tmp)
}

/// Moves the finished tree `staged` to `dest` (or `dest_1`, ... when taken) and returns where it
/// went: the name is claimed with [`create_unique_dir`], then `staged` is renamed onto the
/// claimed (empty) directory in one step. On failure `staged` is removed.
pub fn install_dir(staged: &Path, dest: &Path) -> Result<PathBuf, RunDirError> {
    let result = create_unique_dir(dest).and_then(|claimed| {
        std::fs::rename(staged, &claimed)
            .map(|()| claimed.clone())
            .map_err(|e| {
                let _ = std::fs::remove_dir(&claimed);
                io_err(&claimed, e)
            })
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(staged);
    }
    result
}

/// What `flotilla run` prepares.
#[derive(Clone, Debug, Default)]
pub struct RunRequest {
    pub overrides: Vec<String>,
    pub sweep_file: Option<SweepFile>,
    /// `-m`: expand sweeps into one job per combination, under a sweep directory.
    pub multirun: bool,
    /// The command line, for `meta.json` and the plan.
    pub argv: Vec<String>,
    /// The job this run is composed again from (`run --from`): its config directory is
    /// recorded in `meta.json` as the jobs' own (the composer reads the copy kept with it), and
    /// the job directory as `rerun_of`.
    pub rerun_of: Option<snapshot::SavedJob>,
}

/// A job whose directory is ready.
#[derive(Clone, Debug)]
pub struct PreparedJob {
    pub num: usize,
    /// The job directory (absolute).
    pub dir: PathBuf,
    /// Task overrides (`key=value`).
    pub overrides: Vec<String>,
    /// The built-in trainer's validated job config (as written to `config.yaml`); `None` for
    /// a job that runs the user's own program.
    pub config: Option<JobConfig>,
    /// Where and with what resources the job runs.
    pub compute: ComputeConfig,
    /// The user's program (`flotilla.task`), kept in the job's `task.json`; `None`: the built-in
    /// trainer.
    pub task: Option<TaskSpec>,
}

/// The prepared directories of one `flotilla run`.
#[derive(Clone, Debug)]
pub struct PreparedRun {
    /// The sweep directory (absolute) for `-m`, `None` for a single run.
    pub sweep_dir: Option<PathBuf>,
    /// `sweep.json` of the sweep, or `job.json` of the single run.
    pub plan: PlanFile,
    /// `local` or `slurm`: the jobs' `compute.launcher` (one for all jobs).
    pub launcher: flotilla_config::schema::Launcher,
    pub jobs: Vec<PreparedJob>,
}

/// One composed job, before anything exists on disk.
struct Staged {
    num: usize,
    /// Relative to the sweep directory; empty for a single run.
    subdir: PathBuf,
    overrides: Vec<String>,
    /// Runtime overrides kept for `run --from` (see [`Meta::runtime_overrides`]).
    runtime_overrides: Vec<String>,
    config_yaml: String,
    config: Option<JobConfig>,
    compute: ComputeConfig,
    task: Option<TaskSpec>,
}

/// Key of the plan file holding the job name (`flotilla.job.name`, e.g. sbatch's `--job-name`).
pub const JOB_NAME_KEY: &str = "job_name";

/// The resolved runtime node `flotilla.<key>` of a composed job. Only that key is resolved (a
/// run has no `flotilla.job.num`, so `sweep.subdir` cannot resolve there).
fn runtime_node(composed: &Composed, ctx: &ResolveContext, key: &str) -> Result<Node, ConfigError> {
    let mut root = composed.job.clone();
    if let Value::Dict(d) = &mut root.value {
        for k in RUNTIME_KEYS {
            d.insert(k.to_string(), composed.runtime.clone());
        }
    }
    let exists = composed.runtime.select(key).is_some();
    if !exists {
        return Err(ConfigError::Composition(format!(
            "the runtime node has no 'flotilla.{key}'"
        )));
    }
    let path: Vec<String> = std::iter::once("flotilla")
        .chain(key.split('.'))
        .map(String::from)
        .collect();
    Ok(interp::resolve_at(&root, &path, ctx)?)
}

/// The resolved runtime value `flotilla.<key>` of a composed job, as a path string.
fn runtime_path(
    composed: &Composed,
    ctx: &ResolveContext,
    key: &str,
) -> Result<String, ConfigError> {
    let node = runtime_node(composed, ctx, key)?;
    match &node.value {
        Value::Str(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
            let s = python_str(&node.value);
            if s.is_empty() {
                Err(ConfigError::Composition(format!(
                    "flotilla.{key} is empty ({})",
                    node.origin
                )))
            } else {
                Ok(s)
            }
        }
        other => Err(ConfigError::Composition(format!(
            "flotilla.{key} must be a path, got {} ({})",
            other.type_name(),
            node.origin
        ))),
    }
}

/// The facts every `meta.json` of one command records: the command line, who and where, and
/// the config it was composed from — for a job composed again from its own files (`rerun_of`),
/// the original's config directory and the job itself.
fn provenance_for(
    composer: &Composer,
    argv: &[String],
    rerun_of: Option<&snapshot::SavedJob>,
) -> Provenance {
    let absolute = |p: &Path| std::path::absolute(p).ok().map(|p| p.display().to_string());
    let mut provenance = Provenance::collect(argv.to_vec());
    provenance.source = ComposeSource {
        config_dir: match rerun_of {
            Some(saved) => saved.meta.config_dir.clone(),
            None => absolute(&composer.options().config_dir),
        },
        rerun_of: rerun_of.and_then(|saved| absolute(&saved.job_dir)),
        config_name: Some(composer.options().config_name.clone()),
        validate: composer.validates(),
    };
    provenance
}

/// Writes one job's directory: `config.yaml`, `overrides.yaml`, `task.json` (a user program),
/// `meta.json` and an empty `logs/`.
fn write_job_files(
    dir: &Path,
    job: &Staged,
    provenance: &Provenance,
    launcher_name: &str,
    conf_snapshot: Option<String>,
) -> Result<(), RunDirError> {
    let logs = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs).map_err(|e| io_err(&logs, e))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| io_err(&p, e))
    };
    write(CONFIG_FILE, job.config_yaml.as_bytes())?;
    write(OVERRIDES_FILE, overrides_yaml(&job.overrides).as_bytes())?;
    if let Some(task) = &job.task {
        write(TASK_FILE, task.to_json().as_bytes())?;
    }
    let meta = provenance.meta(
        job.num,
        launcher_name,
        &job.overrides,
        &job.runtime_overrides,
        conf_snapshot,
    );
    let mut text = serde_json::to_string_pretty(&meta).expect("meta serialises");
    text.push('\n');
    write(META_FILE, text.as_bytes())
}

/// The runtime overrides of a composed job (`overrides.hydra` of its runtime node) that
/// `run --from` applies again: all but those of the run and sweep directories, which belong to
/// the run that made the job.
fn replayable_runtime_overrides(runtime: &Node) -> Vec<String> {
    let Some(Value::List(items)) = runtime.select("overrides.hydra").map(|n| &n.value) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|n| n.value.as_str())
        .filter(|o| {
            let key = o.trim_start_matches(['~', '+']);
            let key = key.split_once('=').map_or(key, |(k, _)| k);
            let rest = key.split_once('.').map_or("", |(_, r)| r);
            !(rest.starts_with("run.")
                || rest.starts_with("sweep.")
                || rest == "run"
                || rest == "sweep")
        })
        .map(str::to_string)
        .collect()
}

/// What a composed job runs, validated.
#[derive(Clone, Debug)]
pub struct JobRuns {
    /// The built-in trainer's typed config; `None` for the user's own program.
    pub config: Option<JobConfig>,
    pub compute: ComputeConfig,
    /// The user's own program (`flotilla.task.command` set).
    pub task: Option<TaskSpec>,
}

/// What `composed` runs: the user's program of `flotilla.task` (its task and `compute` checked,
/// the rest of the config left to the program; a relative `cwd` taken from `start_dir`), or
/// the built-in trainer (the whole job validated).
pub fn job_runs(
    composed: &Composed,
    ctx: &ResolveContext,
    start_dir: &Path,
) -> Result<JobRuns, ConfigError> {
    if composed.runs_user_task() {
        let node = runtime_node(composed, ctx, "task")?;
        let (task, compute) = flotilla_config::schema::validate_user_task(&node, &composed.job)?;
        let mut spec = TaskSpec::new(&task, &compute, start_dir);
        if task.config_arg == Some(flotilla_config::schema::ConfigArg::Hydra) {
            spec.hydra_job = Some(HydraJob::from_runtime(&composed.runtime));
        }
        return Ok(JobRuns {
            config: None,
            compute,
            task: Some(spec),
        });
    }
    let config = composed.typed.clone().ok_or_else(|| {
        ConfigError::Composition(
            "the composed config is not a flotilla job (it needs model, trainer, data and compute sections, and validation on), and flotilla.task.command names no program of your own to run instead".into(),
        )
    })?;
    Ok(JobRuns {
        compute: config.compute.clone(),
        config: Some(config),
        task: None,
    })
}

/// Warns, once per run, of jobs whose `max_steps` ends inside the warmup: their learning rate
/// never reaches `trainer.lr` (valid, but rarely meant: a short trial run of a config sized for
/// a long one).
fn warn_unwarmed(unwarmed: &[(usize, u64, u64)], jobs: usize) {
    let Some(&(num, warmup, max)) = unwarmed.first() else {
        return;
    };
    let which = match (jobs, unwarmed.len()) {
        (1, _) => "the job".to_string(),
        (_, 1) => format!("job {num}"),
        (_, n) => format!("{n} of the {jobs} jobs (job {num}:"),
    };
    let close = if which.ends_with(':') { ")" } else { "" };
    tracing::warn!(
        "{which} stops before its learning-rate warmup ends{close}: trainer.max_steps={max} < \
         trainer.warmup_steps={warmup}, so the learning rate never reaches trainer.lr; lower \
         the warmup (e.g. trainer.warmup_steps={}) or train longer",
        max / 10
    );
}

/// Refuses a user program that cannot be found before anything is created (local jobs); for
/// SLURM jobs, whose programs are found on the compute nodes, a missing one is a warning.
fn check_programs(
    staged: &[Staged],
    launcher: flotilla_config::schema::Launcher,
) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for job in staged {
        let Some(task) = &job.task else { continue };
        let key = (
            task.argv[0].clone(),
            task.cwd.clone(),
            task.env.get("PATH").cloned(),
        );
        if !seen.insert(key) {
            continue;
        }
        if let Err(why) = task.find_program() {
            let message = format!(
                "flotilla.task.command: cannot run job {}'s program: {why}; install it, put it on PATH, or give its path",
                job.num
            );
            if launcher == flotilla_config::schema::Launcher::Slurm {
                tracing::warn!("{message} (on this machine; the compute nodes may have it)");
            } else {
                return Err(ConfigError::Composition(message));
            }
        }
    }
    Ok(())
}

/// Composes and validates every job of `req` (nothing is created when one fails), then creates
/// the run directory (one run) or the sweep directory with one sub-directory per job, each
/// holding `config.yaml`, `overrides.yaml`, `meta.json` and an empty `logs/`, plus the plan
/// file with every job PENDING.
pub fn prepare(composer: &Composer, req: &RunRequest) -> Result<PreparedRun, RunDirError> {
    let start_dir = std::env::current_dir().map_err(|e| io_err(Path::new("."), e))?;
    let provenance = provenance_for(composer, &req.argv, req.rerun_of.as_ref());
    let config_dir = &composer.options().config_dir;
    let mut staged: Vec<Staged> = Vec::new();
    let mut dest: Option<String> = None;
    let mut launcher = None;
    let mut job_name: Option<String> = None;
    let mut seen_subdirs: HashSet<PathBuf> = HashSet::new();
    // Jobs that end before their warmup does: (job number, warmup_steps, max_steps).
    let mut unwarmed: Vec<(usize, u64, u64)> = Vec::new();
    plan_each(
        composer,
        &req.overrides,
        req.sweep_file.as_ref(),
        req.multirun,
        |job| {
            let what = if req.multirun {
                format!("job {} ({})", job.num, job.overrides.join(" "))
            } else {
                "the job".to_string()
            };
            let ctx = composer.context();
            let JobRuns {
                config,
                compute,
                task,
            } = job_runs(&job.composed, ctx, &start_dir).map_err(|e| match req.multirun {
                true => ConfigError::Composition(format!("{what}:\n{e}")),
                false => e,
            })?;
            // Will it fit? A GPU job whose estimate exceeds its GPU is refused here, before
            // anything is created (arithmetic only; `compute.check_memory: false` skips it).
            // A job from a base directory is priced and checked as that base.
            if let Some(config) = &config {
                let trained = crate::base_model::trained_job(config)
                    .map_err(|e| ConfigError::Composition(format!("{what}: {e}")))?;
                crate::memory::check(&trained, &what)
                    .map_err(|e| ConfigError::Composition(e.to_string()))?;
                // A LoRA adapter to start from must fit the job's base.
                crate::preflight::check(&trained, &what).map_err(ConfigError::Composition)?;
                let t = &config.trainer;
                if t.warmup_steps > t.max_steps {
                    unwarmed.push((job.num, t.warmup_steps, t.max_steps));
                }
            }
            match launcher {
                None => launcher = Some(compute.launcher),
                Some(l) if l != compute.launcher => {
                    return Err(ConfigError::Composition(format!(
                        "{what} uses compute.launcher={} but job 0 uses {l}; the jobs of one sweep run on one launcher",
                        compute.launcher
                    )))
                }
                Some(_) => {}
            }
            if job_name.is_none() {
                job_name = Some(runtime_path(&job.composed, ctx, "job.name")?);
            }
            let subdir = if req.multirun {
                if dest.is_none() {
                    dest = Some(runtime_path(&job.composed, ctx, "sweep.dir")?);
                }
                let sub = runtime_path(&job.composed, ctx, "sweep.subdir")?;
                let path = PathBuf::from(&sub);
                let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
                if !plain {
                    return Err(ConfigError::Composition(format!(
                        "{what}: flotilla.sweep.subdir='{sub}' must be a relative path inside the sweep directory (no '..', not absolute)"
                    )));
                }
                if !seen_subdirs.insert(path.clone()) {
                    return Err(ConfigError::Composition(format!(
                        "{what}: flotilla.sweep.subdir='{sub}' is the directory of an earlier job too; make it unique per job (e.g. ${{flotilla.job.num}})"
                    )));
                }
                path
            } else {
                dest = Some(runtime_path(&job.composed, ctx, "run.dir")?);
                PathBuf::new()
            };
            staged.push(Staged {
                num: job.num,
                subdir,
                overrides: job.composed.task_overrides.clone(),
                runtime_overrides: replayable_runtime_overrides(&job.composed.runtime),
                config_yaml: to_yaml(&job.composed.job, EmitOptions { provenance: false }),
                config,
                compute,
                task,
            });
            Ok(())
        },
    )?;
    let (Some(dest), Some(launcher)) = (dest, launcher) else {
        return Err(ConfigError::Composition("the sweep has no jobs".into()).into());
    };
    warn_unwarmed(&unwarmed, staged.len());
    check_programs(&staged, launcher)?;
    let dest = std::path::absolute(&dest).map_err(|e| io_err(Path::new(&dest), e))?;
    let launcher_name = launcher.as_str();

    // Build the whole tree out of sight, then move it into place in one step.
    let tmp = staging_dir(&dest)?;
    let built = (|| -> Result<(), RunDirError> {
        let snapshot_kept =
            snapshot::copy_config_dir(config_dir, &tmp.join(snapshot::SNAPSHOT_DIR))?;
        let mut records = Vec::with_capacity(staged.len());
        for job in &staged {
            let conf_snapshot =
                snapshot_kept.then(|| snapshot::snapshot_path_from_job(&job.subdir));
            write_job_files(
                &tmp.join(&job.subdir),
                job,
                &provenance,
                launcher_name,
                conf_snapshot,
            )?;
            let rel = if req.multirun {
                job.subdir.clone()
            } else {
                PathBuf::from(".")
            };
            records.push(JobRecord::pending(job.num, rel, job.overrides.clone()));
        }
        let plan = Plan::new(
            req.multirun,
            provenance.time.clone(),
            launcher,
            req.argv.clone(),
            records,
            job_name.as_deref(),
        );
        let file = if req.multirun {
            PlanFile::sweep(&tmp)
        } else {
            PlanFile::single(&tmp)
        };
        plan::write_new(&file, &plan)
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let root = install_dir(&tmp, &dest)?;
    let jobs = staged
        .into_iter()
        .map(|s| PreparedJob {
            num: s.num,
            dir: if req.multirun {
                root.join(&s.subdir)
            } else {
                root.clone()
            },
            overrides: s.overrides,
            config: s.config,
            compute: s.compute,
            task: s.task,
        })
        .collect();
    Ok(PreparedRun {
        sweep_dir: req.multirun.then(|| root.clone()),
        plan: if req.multirun {
            PlanFile::sweep(&root)
        } else {
            PlanFile::single(&root)
        },
        launcher,
        jobs,
    })
}
