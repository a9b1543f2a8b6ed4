//! `flotilla status DIR`: [`status`] combines what a run directory records with its
//! launcher's live view ([`live_states`]); [`status_text`] and [`status_json`] render it.

use crate::rundir::status::{read_located, KnownMarkers, Located, RunStatus};
use crate::rundir::{self, JobState, Plan};
use crate::{local, slurm, LaunchError};
use flotilla_config::schema::Launcher as LauncherKind;
use std::collections::HashMap;
use std::path::Path;

/// The launcher's live view of a plan's jobs (by job number), for `flotilla status`: the local
/// launcher reports jobs whose `flotilla run` is gone; SLURM asks squeue/sacct once for all ids.
pub fn live_states(plan: &Plan) -> Result<HashMap<usize, JobState>, LaunchError> {
    match plan.launcher {
        LauncherKind::Local => Ok(local::live_states(plan)),
        LauncherKind::Slurm => Ok(slurm::live_states(plan)?),
    }
}

/// `flotilla status DIR`: every job of a run or sweep directory (or the one job of a job
/// directory inside a sweep), its recorded state corrected by the launcher's live view and by
/// the directory's markers.
pub fn status(dir: &Path) -> Result<RunStatus, LaunchError> {
    status_with_markers(dir, None)
}

/// [`status`], with the markers of the jobs in `known` (by job directory) taken from it
/// instead of read from their files again.
pub fn status_with_markers(
    dir: &Path,
    known: Option<&KnownMarkers>,
) -> Result<RunStatus, LaunchError> {
    let located = rundir::status::locate(dir)?;
    let plan = located.plan.as_ref().map(|p| p.read()).transpose()?;
    status_of_located(dir, located, plan, known)
}

/// [`status_with_markers`] for a directory already [`locate`](rundir::status::locate)d, with
/// its plan already read when it has one (a sweep of thousands of jobs has a large plan).
pub fn status_of_located(
    dir: &Path,
    located: Located,
    plan: Option<Plan>,
    known: Option<&KnownMarkers>,
) -> Result<RunStatus, LaunchError> {
    let (live, gone) = match &plan {
        Some(plan) => match plan.launcher {
            // One batched squeue/sacct query; state changes are written back to the plan.
            LauncherKind::Slurm => return Ok(slurm::status(dir)?),
            LauncherKind::Local => (live_states(plan)?, local::supervisor_gone(plan)),
        },
        None => (HashMap::new(), None),
    };
    let mut st = read_located(dir, located, plan, &|j| live.get(&j.num).copied(), known)?;
    // A job left RUNNING by a `flotilla run` that is gone says why it is UNKNOWN.
    if let Some(reason) = gone {
        for j in &mut st.jobs {
            if j.state == JobState::Unknown && j.message.is_none() {
                j.message = Some(reason.clone());
            }
        }
    }
    Ok(st)
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
        st.launcher.map_or("unknown launcher", LauncherKind::as_str),
        summary.join(", ")
    );
    // The nodes column, only when the scheduler named a job's nodes.
    let nodes_width = st
        .jobs
        .iter()
        .filter_map(|j| j.nodes.as_ref().map(String::len))
        .max()
        .map(|w| w.max("nodes".len()));
    let nodes_cell = |n: Option<&str>| match nodes_width {
        Some(w) => format!("{:<w$}  ", n.unwrap_or("-")),
        None => String::new(),
    };
    out.push_str(&format!(
        "{:>5}  {:<13} {:<12} {:>8}  {}{}\n",
        "job",
        "state",
        "job id",
        "steps",
        nodes_cell(Some("nodes")),
        "dir"
    ));
    for j in &st.jobs {
        out.push_str(&format!(
            "{:>5}  {:<13} {:<12} {:>8}  {}{}{}\n",
            j.num,
            j.state.as_str(),
            match (&j.job_id, j.step) {
                (Some(id), Some(step)) => format!("{id}.{step}"),
                (Some(id), None) => id.clone(),
                (None, _) => "-".into(),
            },
            j.steps.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            nodes_cell(j.nodes.as_deref()),
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
/// "state", "recorded", "steps", "final_model", "message"}]}`, each job with `"step"` (a packed
/// job's job step) and `"nodes"` (SLURM's node list) when known.
pub fn status_json(st: &RunStatus) -> String {
    let mut s = serde_json::to_string(st).expect("status serialises");
    s.push('\n');
    s
}
