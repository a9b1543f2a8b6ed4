//! The status of a SLURM run: [`status`] combines the plan's records, one batched scheduler
//! query and the directories' markers, and writes state changes back to the plan; a job that
//! failed gets the reason from its logs as its message ([`failure_message`], which reads srun's
//! error lines with [`parse_srun_error`]).

use super::queue::{known_state, query};
use super::SlurmError;
use crate::rundir::status::{locate, read_status, RunStatus};
use crate::rundir::{JobRecord, JobState, LOGS_DIR};
use crate::{RankFailure, TaskExit};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lines of a failing task's log kept in a FAILED job's message.
pub const LOG_TAIL_LINES: usize = 15;

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
        .filter_map(|j| {
            // A packed job no allocation has claimed yet: ask about its array of allocations.
            j.job_id.clone().or_else(|| {
                j.extra
                    .get(super::pack::PACK_ARRAY_KEY)
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
        })
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
        if super::pack::is_packed(j) && j.job_id.is_none() {
            let array = j.extra.get(super::pack::PACK_ARRAY_KEY)?.as_str()?;
            let prefix = format!("{array}_");
            let allocations: Option<Vec<JobState>> = live.as_ref().map(|l| {
                l.iter()
                    .filter(|(id, _)| *id == array || id.starts_with(&prefix))
                    .map(|(_, job)| job.state)
                    .collect()
            });
            return super::pack::unclaimed_state(j.state, allocations.as_deref());
        }
        let id = j.job_id.as_ref()?;
        if super::pack::is_packed(j) {
            // The packing loop keeps the record; the allocation tells only how it ended.
            let allocation = live.as_ref().and_then(|l| l.get(id)).map(|l| l.state);
            return super::pack::packed_state(j.state, allocation);
        }
        known_state(live.as_ref(), &plan_file.job_dir(j), id).or_else(|| {
            // Submitted, and the scheduler has forgotten it without a word from the job.
            (live.is_some() && !j.state.is_terminal()).then_some(JobState::Unknown)
        })
    };
    let mut status = read_status(dir, &lookup)?;
    if let Some(live) = &live {
        for js in &mut status.jobs {
            js.nodes = js
                .job_id
                .as_ref()
                .and_then(|id| live.get(id))
                .and_then(|l| l.nodes.clone());
        }
    }

    // Write changes back, with a log tail for failures.
    let mut changes: BTreeMap<usize, (JobState, Option<String>)> = BTreeMap::new();
    for js in &mut status.jobs {
        let Some(recorded) = js.recorded else {
            continue;
        };
        // A packed job's record belongs to the loop that runs it.
        if js.step.is_some() || plan.job(js.num).is_some_and(super::pack::is_packed) {
            continue;
        }
        if js.state == recorded {
            continue;
        }
        let message = end_message(js.state, &js.dir);
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

/// The message of a job that ended in `state`: its [`failure_message`] when it failed (FAILED,
/// OUT_OF_MEMORY, NODE_FAIL, TIMEOUT); none otherwise.
pub fn end_message(state: JobState, job_dir: &Path) -> Option<String> {
    match state {
        JobState::Failed | JobState::OutOfMemory | JobState::NodeFail | JobState::Timeout => {
            failure_message(job_dir)
        }
        _ => None,
    }
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
        .map(|p| crate::launcher::log_tail(p, 200))
        .unwrap_or_default();
    if let Some((rank, exit)) = err_tail.iter().rev().find_map(|l| parse_srun_error(l)) {
        let log = logs.join(flotilla_contract::layout::rank_log_name(rank));
        let tail = crate::launcher::log_tail(&log, LOG_TAIL_LINES);
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
        let tail = crate::launcher::log_tail(&log, LOG_TAIL_LINES);
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
