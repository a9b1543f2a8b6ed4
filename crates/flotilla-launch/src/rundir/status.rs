//! What a run directory says about its jobs: the recorded state from the plan file and the
//! directory's own markers (`metrics.csv`'s last step, `final/` present). Launchers add live
//! states on top (see `launch::status`).

use super::{JobRecord, JobState, Plan, PlanFile, RunDirError, META_FILE, STEP_KEY};
use flotilla_config::schema::Launcher as LauncherKind;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What a job directory shows by itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Markers {
    /// Steps done according to `metrics.csv` (its last row's `step` + 1).
    pub steps: Option<u64>,
    /// `final/` exists: training finished and saved the model.
    pub final_model: bool,
}

/// Reads the markers of one job directory.
pub fn markers(job_dir: &Path) -> Markers {
    Markers {
        steps: last_step(&job_dir.join(flotilla_contract::layout::METRICS_CSV)).map(|s| s + 1),
        final_model: has_final_model(job_dir),
    }
}

/// Whether the job saved its final model (`final/` exists): training finished.
pub fn has_final_model(job_dir: &Path) -> bool {
    job_dir.join(flotilla_contract::layout::FINAL_DIR).is_dir()
}

/// Bytes read from the end of a metrics CSV for its last row: a long run's file costs no more
/// than a short one's.
const TAIL_BYTES: u64 = 64 * 1024;

/// The `step` column of the last data row of a metrics CSV (its header and at most its last
/// [`TAIL_BYTES`] are read).
fn last_step(path: &Path) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut text = Vec::new();
    let tail_start = len.saturating_sub(TAIL_BYTES);
    if tail_start == 0 {
        file.read_to_end(&mut text).ok()?;
    } else {
        // The header from the first few KiB, then the tail.
        let mut head = vec![0u8; 4096];
        let n = file.read(&mut head).ok()?;
        head.truncate(n);
        let header_end = head.iter().position(|b| *b == b'\n')? + 1;
        text.extend_from_slice(&head[..header_end]);
        file.seek(SeekFrom::Start(tail_start)).ok()?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).ok()?;
        // The tail's first line is likely cut: skip it.
        let first_end = tail.iter().position(|b| *b == b'\n')? + 1;
        text.extend_from_slice(&tail[first_end..]);
    }
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next()?;
    let col = header.split(',').position(|h| h.trim() == "step")?;
    text.lines()
        .rev()
        .filter(|l| !l.trim().is_empty() && *l != header)
        .find_map(|l| l.split(',').nth(col)?.trim().parse::<u64>().ok())
}

/// The state to show: the launcher's live state when it has one, else the recorded state, and
/// COMPLETED when the directory holds `final/` (written whole, as training's last act) and
/// nothing says the job failed or is still alive: a job the scheduler still sees pending,
/// running or requeued shows that state until its process has exited.
pub fn combine(recorded: JobState, live: Option<JobState>, markers: &Markers) -> JobState {
    // A study's decision: the scheduler only saw the job cancelled.
    if recorded == JobState::Pruned {
        return recorded;
    }
    let state = live.unwrap_or(recorded);
    let failed = matches!(
        state,
        JobState::Failed | JobState::Cancelled | JobState::NodeFail | JobState::OutOfMemory
    );
    let alive = matches!(
        live,
        Some(JobState::Pending | JobState::Running | JobState::Requeued)
    );
    if markers.final_model && !failed && !alive {
        JobState::Completed
    } else {
        state
    }
}

/// One job's status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobStatus {
    pub num: usize,
    pub dir: PathBuf,
    pub job_id: Option<String>,
    /// The state shown (see [`combine`]).
    pub state: JobState,
    /// The state in the plan file (`null` without one).
    pub recorded: Option<JobState>,
    pub steps: Option<u64>,
    pub final_model: bool,
    pub message: Option<String>,
    /// The job step that ran the job inside its allocation (`job_id`), for a packed sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The nodes the job runs or ran on, as the scheduler lists them (`fltnode[1-2]`); SLURM
    /// only, while the scheduler remembers the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<String>,
}

/// The status of a run or sweep directory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunStatus {
    /// The directory asked about.
    pub dir: PathBuf,
    /// The sweep directory when the jobs belong to a sweep.
    pub sweep_dir: Option<PathBuf>,
    /// `local` or `slurm` (from the plan; `null` without one).
    pub launcher: Option<LauncherKind>,
    pub jobs: Vec<JobStatus>,
}

impl RunStatus {
    /// Are all jobs in a state that will not change by itself?
    pub fn all_terminal(&self) -> bool {
        self.jobs.iter().all(|j| j.state.is_terminal())
    }
}

/// Where a directory's jobs are recorded.
#[derive(Clone, Debug)]
pub struct Located {
    pub plan: Option<PlanFile>,
    /// When `dir` is one job directory of a sweep: that job's number.
    pub only: Option<usize>,
}

/// Finds the plan of `dir`: its own `sweep.json`/`job.json`, or (for a job directory inside a
/// sweep) the `sweep.json` of an enclosing directory listing it. A directory with only a
/// `meta.json` has no plan; anything else is not a run directory.
pub fn locate(dir: &Path) -> Result<Located, RunDirError> {
    if !dir.is_dir() {
        return Err(super::io_err(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ));
    }
    if let Some(plan) = PlanFile::find(dir) {
        return Ok(Located {
            plan: Some(plan),
            only: None,
        });
    }
    let canon = dir.canonicalize().map_err(|e| super::io_err(dir, e))?;
    for ancestor in canon.ancestors().skip(1).take(8) {
        if !ancestor.join(super::SWEEP_FILE).is_file() {
            continue;
        }
        let plan = PlanFile::sweep(ancestor);
        let read = plan.read()?;
        if let Some(job) = read
            .jobs
            .iter()
            .find(|j| plan.job_dir(j).canonicalize().ok().as_deref() == Some(&canon))
        {
            return Ok(Located {
                only: Some(job.num),
                plan: Some(plan),
            });
        }
    }
    if dir.join(META_FILE).is_file() {
        return Ok(Located {
            plan: None,
            only: None,
        });
    }
    Err(RunDirError::NotARunDir {
        path: dir.to_path_buf(),
    })
}

/// The status from the directory alone: recorded states and markers. `live` gives a launcher's
/// state for a job record (`None`: no opinion).
pub fn read_status(
    dir: &Path,
    live: &dyn Fn(&JobRecord) -> Option<JobState>,
) -> Result<RunStatus, RunDirError> {
    read_status_with(dir, live, None)
}

/// The markers of job directories, by directory, as a caller that has read the jobs' files
/// already found them, so that they are not read twice.
pub type KnownMarkers = std::collections::HashMap<PathBuf, Markers>;

/// [`read_status`], taking the markers of the jobs in `known` from it instead of their files.
pub fn read_status_with(
    dir: &Path,
    live: &dyn Fn(&JobRecord) -> Option<JobState>,
    known: Option<&KnownMarkers>,
) -> Result<RunStatus, RunDirError> {
    read_located(dir, locate(dir)?, None, live, known)
}

/// [`read_status_with`] for a directory already [`locate`]d, with its plan when the caller has
/// read it already (a sweep of thousands of jobs has a large plan).
pub fn read_located(
    dir: &Path,
    located: Located,
    plan: Option<Plan>,
    live: &dyn Fn(&JobRecord) -> Option<JobState>,
    known: Option<&KnownMarkers>,
) -> Result<RunStatus, RunDirError> {
    let Some(plan_file) = located.plan else {
        let m = markers(dir);
        let state = combine(JobState::Unknown, None, &m);
        let num = std::fs::read_to_string(dir.join(META_FILE))
            .ok()
            .and_then(|t| serde_json::from_str::<super::Meta>(&t).ok())
            .map(|m| m.job_num)
            .unwrap_or(0);
        return Ok(RunStatus {
            dir: dir.to_path_buf(),
            sweep_dir: None,
            launcher: None,
            jobs: vec![JobStatus {
                num,
                dir: dir.to_path_buf(),
                job_id: None,
                state,
                recorded: None,
                steps: m.steps,
                final_model: m.final_model,
                message: None,
                step: None,
                nodes: None,
            }],
        });
    };
    let plan = match plan {
        Some(plan) => plan,
        None => plan_file.read()?,
    };
    let records: Vec<&JobRecord> = plan
        .jobs
        .iter()
        .filter(|j| located.only.is_none_or(|n| n == j.num))
        .collect();
    // Each job's markers, read on every core (a sweep of thousands of jobs is thousands of
    // files) unless known already; the launcher's view is asked in order, on this thread.
    let job_marks = |j: &&JobRecord| {
        let job_dir = plan_file.job_dir(j);
        let m = match known.and_then(|k| k.get(&job_dir)) {
            Some(m) => m.clone(),
            None => markers(&job_dir),
        };
        (job_dir, m)
    };
    let all_known = known.is_some_and(|k| k.len() >= records.len());
    let marks: Vec<(PathBuf, Markers)> = if all_known {
        records.iter().map(job_marks).collect()
    } else {
        records.par_iter().map(job_marks).collect()
    };
    let jobs = records
        .into_iter()
        .zip(marks)
        .map(|(j, (job_dir, m))| JobStatus {
            num: j.num,
            dir: job_dir,
            job_id: j.job_id.clone(),
            state: combine(j.state, live(j), &m),
            recorded: Some(j.state),
            steps: m.steps,
            final_model: m.final_model,
            message: j.message.clone(),
            step: j.extra.get(STEP_KEY).and_then(|v| v.as_u64()),
            nodes: None,
        })
        .collect();
    Ok(RunStatus {
        dir: dir.to_path_buf(),
        sweep_dir: plan_file.is_sweep().then(|| plan_file.dir().to_path_buf()),
        launcher: Some(plan.launcher),
        jobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_step_of_short_long_and_cut_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "step,loss\n0,2.5\n1,2.0\n").unwrap();
        assert_eq!(last_step(&path), Some(1));
        // A row being written: the last whole one counts.
        std::fs::write(&path, "loss,step\n2.5,0\n2.0,1\n1.9,").unwrap();
        assert_eq!(last_step(&path), Some(1));
        // Longer than the tail read: the header from the head, the step from the tail.
        let mut text = String::from("loss,step,eval_loss\n");
        for step in 0..20_000 {
            text.push_str(&format!("{},{step},\n", 3.0 - step as f64 * 1e-4));
        }
        assert!(text.len() as u64 > 2 * TAIL_BYTES);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(last_step(&path), Some(19_999));
        std::fs::write(&path, "step,loss\n").unwrap();
        assert_eq!(last_step(&path), None);
        assert_eq!(last_step(&dir.path().join("missing.csv")), None);
    }
}
