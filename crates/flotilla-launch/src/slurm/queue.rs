//! Asking the scheduler about jobs and stopping them: one batched `squeue` call (then `sacct`
//! for the jobs squeue has forgotten) for any number of ids ([`query`], with the parsers of
//! both outputs), the exit marker a job's batch script leaves ([`exit_marker`]), the state that
//! all of this gives a job ([`job_state`]), and `scancel` ([`request_stop`], [`cancel`]).

use super::{run_command, SlurmError, EXIT_MARKER};
use crate::rundir::{JobState, Plan, LOGS_DIR};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// What the scheduler says about one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveJob {
    pub state: JobState,
    /// The scheduler's own word (`PENDING`, `COMPLETING`, `CANCELLED by 0`, ...).
    pub raw: String,
    /// squeue's reason (`None`, `JobArrayTaskLimit`, `BeginTime`, ...), if any.
    pub reason: Option<String>,
    /// The nodes the job runs or ran on, as the scheduler writes the list (`fltnode[1-2]`);
    /// `None` while none is allocated.
    pub nodes: Option<String>,
}

/// A node list field: `None` when empty or `None assigned` (sacct's word for a job that never
/// ran).
fn node_list(field: Option<&str>) -> Option<String> {
    field
        .map(str::trim)
        .filter(|n| !n.is_empty() && *n != "None assigned" && *n != "(null)")
        .map(str::to_string)
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

/// Parses `squeue -h -o '%i|%T|%r|%N'` output (the node list may be absent).
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
            nodes: node_list(f.next()),
        };
        for id in expand_ids(id.trim()) {
            out.insert(id, live.clone());
        }
    }
    out
}

/// Parses `sacct -n -P -X -o JobID,State,NodeList` output (the node list may be absent).
pub fn parse_sacct(text: &str) -> HashMap<String, LiveJob> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some((id, state)) = line.split_once('|') else {
            continue;
        };
        let mut rest = state.split('|');
        let state = rest.next().unwrap_or("").trim();
        let nodes = node_list(rest.next());
        for id in expand_ids(id.trim()) {
            out.insert(
                id,
                LiveJob {
                    state: JobState::from_slurm(state),
                    raw: state.to_string(),
                    reason: None,
                    nodes: nodes.clone(),
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
        &["-j", &list, "-t", "all", "-h", "-o", "%i|%T|%r|%N"],
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
            &["-j", &list, "-n", "-P", "-X", "-o", "JobID,State,NodeList"],
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

/// `scancel ARGS... ID`: asks the scheduler to signal or cancel a job ([`request_stop`] then,
/// after a grace period, [`cancel`] is how a study stops a pruned trial).
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

/// The state the batch script recorded in `JOB_DIR/logs/slurm.exit` for the job `id`, if any.
pub fn exit_marker(job_dir: &Path, id: &str) -> Option<JobState> {
    let text = std::fs::read_to_string(job_dir.join(LOGS_DIR).join(EXIT_MARKER)).ok()?;
    let mut words = text.split_whitespace();
    (words.next()? == id).then(|| JobState::from_slurm(words.next().unwrap_or("")))
}

/// What is known about SLURM job `id` (its directory `job_dir`): the scheduler's state when
/// `live` (its answer to a [`query`]; `None` when it could not be asked) knows the job, else the
/// state its batch script recorded in the [`exit_marker`]; `None` when neither tells.
pub fn known_state(
    live: Option<&HashMap<String, LiveJob>>,
    job_dir: &Path,
    id: &str,
) -> Option<JobState> {
    match live.and_then(|l| l.get(id)) {
        Some(l) => Some(l.state),
        None => exit_marker(job_dir, id),
    }
}

/// The state of SLURM job `id` (its directory `job_dir`): its [`known_state`], or UNKNOWN when
/// the scheduler answered but no longer knows the job and the job left no exit marker; `None`
/// when the scheduler could not be asked and there is no marker.
pub fn job_state(
    live: Option<&HashMap<String, LiveJob>>,
    job_dir: &Path,
    id: &str,
) -> Option<JobState> {
    known_state(live, job_dir, id).or_else(|| live.map(|_| JobState::Unknown))
}

/// Asks job `id` to stop: `scancel --signal=TERM --full ID`. The tasks get TERM (the built-in
/// trainer checkpoints and exits); `--full` signals the batch shell too, so that it never
/// requeues the job.
pub fn request_stop(id: &str) -> Result<(), SlurmError> {
    scancel(id, &["--signal=TERM", "--full"])
}

/// Cancels job `id` outright (`scancel ID`), e.g. once the grace period after
/// [`request_stop`] is over.
pub fn cancel(id: &str) -> Result<(), SlurmError> {
    scancel(id, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_from_squeue_and_sacct() {
        let q = parse_squeue("5_[2-3]|PENDING|Resources|\n5_0|RUNNING|None|fltnode[1-2]\n");
        assert_eq!(q["5_0"].nodes.as_deref(), Some("fltnode[1-2]"));
        assert_eq!(q["5_2"].nodes, None);
        // Without the field (an older format): no node list.
        assert_eq!(parse_squeue("9|RUNNING|None\n")["9"].nodes, None);
        let a = parse_sacct("7|COMPLETED|fltnode[2-3]\n8|CANCELLED by 0|None assigned\n");
        assert_eq!(a["7"].nodes.as_deref(), Some("fltnode[2-3]"));
        assert_eq!(a["7"].state, JobState::Completed);
        assert_eq!(a["8"].nodes, None);
        assert_eq!(a["8"].state, JobState::Cancelled);
    }
}
