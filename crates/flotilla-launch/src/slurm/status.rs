//! The status of a SLURM run: [`status`] combines the plan's records, one batched scheduler
//! query ([`live_view`]: what it says of each job, packed or not) and the directories' markers,
//! and writes state changes back to the plan; a job that failed gets the reason from its logs as
//! its message ([`failure_message`], which reads srun's error lines with [`parse_srun_error`]),
//! a job the scheduler forgot without a word from it why it is UNKNOWN ([`forgotten_message`]).

use super::queue::{known_state, query, LiveJob};
use super::SlurmError;
use crate::rundir::status::{locate, read_status, RunStatus};
use crate::rundir::{JobRecord, JobState, PlanFile, LOGS_DIR};
use crate::{RankFailure, TaskExit};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Lines of a failing task's log kept in a FAILED job's message.
pub const LOG_TAIL_LINES: usize = 15;

/// The status of a run or sweep directory (or one job directory of a sweep): the plan's
/// records, the scheduler's live states (one batched query) and the directories' markers. State
/// changes are written back to the plan; a newly FAILED job gets its log tail as message, a job
/// the scheduler has forgotten without a word from it ([`live_view`]) the reason it is UNKNOWN.
/// When `squeue` is not installed or fails (controller down), only the directories are
/// consulted (with a warning in the latter case).
pub fn status(dir: &Path) -> Result<RunStatus, SlurmError> {
    let located = locate(dir)?;
    let Some(plan_file) = located.plan else {
        return Ok(read_status(dir, &|_| None)?);
    };
    let plan = plan_file.read()?;
    let mut ids: Vec<String> = Vec::new();
    for j in plan
        .jobs
        .iter()
        .filter(|j| located.only.is_none_or(|n| n == j.num))
    {
        ids.extend(j.job_id.clone());
        // A packed job: also its array of allocations, any of which may run it.
        ids.extend(pack_array(j).map(str::to_string));
    }
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
    // Why a job is UNKNOWN, by job number, for the jobs the scheduler has forgotten.
    let reasons: RefCell<BTreeMap<usize, String>> = RefCell::new(BTreeMap::new());
    let lookup = |j: &JobRecord| -> Option<JobState> {
        let (state, reason) = live_view(j, &plan_file, live.as_ref());
        if let Some(reason) = reason {
            reasons.borrow_mut().insert(j.num, reason);
        }
        state
    };
    let mut status = read_status(dir, &lookup)?;
    let reasons = reasons.into_inner();
    for js in &mut status.jobs {
        if js.state == JobState::Unknown {
            if let Some(reason) = reasons.get(&js.num) {
                js.message = Some(reason.clone());
            }
        }
    }
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
        let message = match js.state {
            JobState::Unknown => js.message.clone().filter(|_| reasons.contains_key(&js.num)),
            state => end_message(state, &js.dir),
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

/// The job array of allocations a packed job was submitted to.
fn pack_array(j: &JobRecord) -> Option<&str> {
    j.extra
        .get(super::pack::PACK_ARRAY_KEY)
        .and_then(|v| v.as_str())
}

/// What the scheduler's answer `live` (`None`: it could not be asked) says about the job of
/// record `j` of the plan `plan`: the state to show (`None`: no opinion, the record and the
/// directory's markers tell) and, when it shows UNKNOWN because the scheduler no longer knows
/// the batch job or allocation that ran it and nothing recorded how it ended, the reason
/// ([`forgotten_message`]).
pub fn live_view(
    j: &JobRecord,
    plan: &PlanFile,
    live: Option<&HashMap<String, LiveJob>>,
) -> (Option<JobState>, Option<String>) {
    if super::pack::is_packed(j) {
        // The states of the allocations of its array.
        let array: Option<Vec<JobState>> = pack_array(j).and_then(|array| {
            let prefix = format!("{array}_");
            live.map(|l| {
                l.iter()
                    .filter(|(id, _)| *id == array || id.starts_with(&prefix))
                    .map(|(_, job)| job.state)
                    .collect()
            })
        });
        let Some(id) = j.job_id.as_ref() else {
            // No allocation has claimed it yet.
            return (
                super::pack::unclaimed_state(j.state, array.as_deref()),
                None,
            );
        };
        // The packing loop keeps the record; the allocations tell only how they ended.
        let allocation = live.and_then(|l| l.get(id)).map(|l| l.state);
        let state = super::pack::packed_state(j.state, allocation, array.as_deref());
        let forgotten = state == Some(JobState::Unknown) && allocation.is_none();
        return (
            state,
            forgotten.then(|| forgotten_message("allocation", id, plan.dir())),
        );
    }
    let Some(id) = j.job_id.as_ref() else {
        return (None, None);
    };
    match known_state(live, &plan.job_dir(j), id) {
        Some(state) => (Some(state), None),
        // Submitted, and the scheduler has forgotten it without a word from the job.
        None if live.is_some() && !j.state.is_terminal() => (
            Some(JobState::Unknown),
            Some(forgotten_message("job", id, plan.dir())),
        ),
        None => (None, None),
    }
}

/// Why a job is UNKNOWN when the scheduler answered but no longer knows `id`, the SLURM `what`
/// ("job", or "allocation" for a packed job) that ran it, and nothing recorded how the job
/// ended; with the command that runs it again (`plan_dir`: its run or sweep directory).
pub fn forgotten_message(what: &str, id: &str, plan_dir: &Path) -> String {
    format!(
        "its {what} {id} is no longer known to the scheduler, and nothing recorded how the job \
         ended (it was killed without a chance to, e.g. by `scancel --signal=KILL` or a lost \
         node); `flotilla run --resume-sweep {}` runs it again",
        plan_dir.display()
    )
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
