//! Finding the jobs under the paths given to `flotilla report`: a sweep directory
//! (`sweep.json`), a single run (`job.json`), a job directory (`meta.json`), or any directory
//! holding them, searched recursively. A plan file that cannot be read does not hide its jobs:
//! their directories are found by their `meta.json` instead, and the problem is kept.

use flotilla_launch::rundir::{JobRecord, JobState, Meta, Plan, PlanFile, META_FILE, SWEEP_FILE};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// How deep below a given path job directories are searched for.
const MAX_DEPTH: usize = 8;
/// Directories of a job that never hold other jobs.
use flotilla_contract::layout::JOB_SUBDIRS;

/// One job found.
#[derive(Clone, Debug)]
pub struct FoundJob {
    pub dir: PathBuf,
    /// The job number (from the plan or `meta.json`; 0 when neither says).
    pub num: usize,
    /// The job's record in its plan file, when there is one.
    pub record: Option<JobRecord>,
    /// The sweep directory the job belongs to.
    pub sweep_dir: Option<PathBuf>,
    /// Why the plan could not be used.
    pub plan_problem: Option<String>,
    /// Why a job its plan records PENDING or RUNNING will never move (its local `flotilla run`
    /// is gone), as `flotilla status` says it.
    pub stale: Option<String>,
}

/// The jobs under `paths`, in the order found (plan order within a sweep); each directory once.
/// Only a path that is not a directory is an error.
pub fn find_jobs(paths: &[PathBuf]) -> Result<Vec<FoundJob>, String> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    for path in paths {
        if !path.is_dir() {
            return Err(format!(
                "{}: no such directory (give a run dir, a sweep dir, or a directory holding them)",
                path.display()
            ));
        }
        walk(path, 0, &mut found, &mut seen);
    }
    Ok(found)
}

fn meta_num(job_dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(job_dir.join(META_FILE)).ok()?;
    serde_json::from_str::<Meta>(&text).ok().map(|m| m.job_num)
}

fn add(found: &mut Vec<FoundJob>, seen: &mut HashSet<PathBuf>, job: FoundJob) {
    let key = job.dir.canonicalize().unwrap_or_else(|_| job.dir.clone());
    add_as(found, seen, job, key);
}

/// [`add`] with the job's canonical path already known.
fn add_as(found: &mut Vec<FoundJob>, seen: &mut HashSet<PathBuf>, job: FoundJob, key: PathBuf) {
    if seen.insert(key) {
        found.push(job);
    }
}

/// The canonical path of a plan's job directory `relative` (as the plan records it) inside
/// the plan's directory, whose canonical path is `canonical_dir`: joined without asking the
/// file system when `relative` is a plain relative path (one system call less per job of a
/// large sweep).
fn canonical_job_dir(canonical_dir: Option<&Path>, job_dir: &Path, relative: &Path) -> PathBuf {
    let plain = relative
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    match canonical_dir {
        Some(dir) if plain && !relative.as_os_str().is_empty() => dir.join(relative),
        _ => job_dir
            .canonicalize()
            .unwrap_or_else(|_| job_dir.to_path_buf()),
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| !n.starts_with('.') && !JOB_SUBDIRS.contains(&n))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort_by_key(|d| natural_key(d));
    dirs
}

/// Orders `2` before `10`.
fn natural_key(path: &Path) -> (u64, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (name.parse().unwrap_or(u64::MAX), name)
}

/// The jobs of the plan `plan_file` of the directory `dir`, read already as `plan`, in plan
/// order and each directory once: what [`find_jobs`] finds of a sweep or run directory.
pub fn jobs_of_plan(dir: &Path, plan_file: &PlanFile, plan: Plan) -> Vec<FoundJob> {
    let mut found = Vec::with_capacity(plan.jobs.len());
    add_plan_jobs(dir, plan_file, plan, &mut found, &mut HashSet::new());
    found
}

fn add_plan_jobs(
    dir: &Path,
    plan_file: &PlanFile,
    plan: Plan,
    found: &mut Vec<FoundJob>,
    seen: &mut HashSet<PathBuf>,
) {
    let sweep_dir = plan_file.is_sweep().then(|| dir.to_path_buf());
    let gone = match plan.launcher {
        flotilla_config::schema::Launcher::Local => flotilla_launch::local::supervisor_gone(&plan),
        flotilla_config::schema::Launcher::Slurm => None,
    };
    let canonical_dir = dir.canonicalize().ok();
    for record in plan.jobs {
        let job_dir = plan_file.job_dir(&record);
        let key = canonical_job_dir(canonical_dir.as_deref(), &job_dir, &record.dir);
        let stale = gone
            .clone()
            .filter(|_| matches!(record.state, JobState::Pending | JobState::Running));
        add_as(
            found,
            seen,
            FoundJob {
                dir: job_dir,
                num: record.num,
                record: Some(record),
                sweep_dir: sweep_dir.clone(),
                plan_problem: None,
                stale,
            },
            key,
        );
    }
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<FoundJob>, seen: &mut HashSet<PathBuf>) {
    if let Some(plan_file) = PlanFile::find(dir) {
        let sweep_dir = plan_file.is_sweep().then(|| dir.to_path_buf());
        match plan_file.read() {
            Ok(plan) => {
                add_plan_jobs(dir, &plan_file, plan, found, seen);
                return;
            }
            Err(error) => {
                let problem = format!("{} unreadable ({error})", plan_file.path().display());
                let candidates = if plan_file.is_sweep() {
                    subdirs(dir)
                } else {
                    vec![dir.to_path_buf()]
                };
                for job_dir in candidates {
                    if job_dir.join(META_FILE).is_file() || job_dir == dir {
                        let num = meta_num(&job_dir).unwrap_or(0);
                        add(
                            found,
                            seen,
                            FoundJob {
                                dir: job_dir,
                                num,
                                record: None,
                                sweep_dir: sweep_dir.clone(),
                                plan_problem: Some(problem.clone()),
                                stale: None,
                            },
                        );
                    }
                }
                return;
            }
        }
    }
    if dir.join(META_FILE).is_file() {
        // A job directory whose sweep lies above the given path.
        let sweep_dir = dir
            .parent()
            .filter(|p| p.join(SWEEP_FILE).is_file())
            .map(Path::to_path_buf);
        let mut stale = None;
        let record = sweep_dir.as_ref().and_then(|s| {
            let plan = PlanFile::sweep(s.clone()).read().ok()?;
            let name = dir.file_name()?;
            let gone = match plan.launcher {
                flotilla_config::schema::Launcher::Local => {
                    flotilla_launch::local::supervisor_gone(&plan)
                }
                flotilla_config::schema::Launcher::Slurm => None,
            };
            let record = plan.jobs.into_iter().find(|j| j.dir.as_os_str() == name)?;
            stale = gone.filter(|_| matches!(record.state, JobState::Pending | JobState::Running));
            Some(record)
        });
        let num = record
            .as_ref()
            .map(|r| r.num)
            .or_else(|| meta_num(dir))
            .unwrap_or(0);
        add(
            found,
            seen,
            FoundJob {
                dir: dir.to_path_buf(),
                num,
                record,
                sweep_dir,
                plan_problem: None,
                stale,
            },
        );
        return;
    }
    if depth >= MAX_DEPTH {
        return;
    }
    for sub in subdirs(dir) {
        walk(&sub, depth + 1, found, seen);
    }
}
