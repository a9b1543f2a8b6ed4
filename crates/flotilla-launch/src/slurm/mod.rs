//! The SLURM launcher: renders `launchers/slurm.sbatch.j2` (or the user's `compute.template`)
//! with minijinja, submits it with `sbatch --parsable` and returns at once (fire and forget),
//! recording the job ids in the run's plan file (`sweep.json` / `job.json`). This module holds
//! [`SlurmLauncher`] (the [`Launcher`] behind `compute.launcher=slurm`) and re-exports the
//! pieces it is built from:
//!
//! - `render.rs`: the sbatch script ([`render_script`]). A single run is one batch job; a sweep
//!   is one job array per group of jobs with the same `compute` config, split into several
//!   arrays when it is larger than the cluster's `MaxArraySize`. Array task `i` runs the `i`-th
//!   job directory listed in its script.
//! - `quote.rs`: every value that reaches a shell goes through [`shell_quote`]; every value in
//!   an `#SBATCH` line through [`sbatch_quote`] (sbatch's own quoting; a newline is refused), so
//!   a config value such as `$(touch x)` is never executed.
//! - `batches.rs`: which `sbatch` submissions a run's jobs make (grouping by `compute` and task
//!   kind, splitting at `MaxArraySize`, packing; [`batches::plan_batches`]), what submission
//!   renders and `flotilla plan` prints ([`batches::describe_batches`]).
//! - `submit.rs`: writing the scripts ([`write_scripts`]) and handing them to
//!   `sbatch --parsable` ([`submit_scripts`]), arrays included.
//! - `queue.rs`: asking `squeue`/`sacct` about jobs ([`query`]), the state a job is in
//!   ([`job_state`], with the exit marker its batch script writes), and `scancel`
//!   ([`request_stop`], [`cancel`]).
//! - `status.rs`: [`status`] asks `squeue` once for every job of a run (and `sacct` when the
//!   cluster has accounting), combines the answer with the run directory's own markers, and
//!   writes state changes back to the plan; a FAILED job gets its failing task's log tail as
//!   its message ([`failure_message`]).
//! - `pack.rs`: `compute.pack`, a sweep's jobs run as job steps of whole-node allocations that
//!   share one queue ([`pack::run_allocation`], the loop `flotilla pack-run` runs).
//! - `error.rs`: [`SlurmError`].
//!
//! The batch shell traps `SIGUSR2` (sent `signal_delay_s` before the time limit with
//! `--signal=B:USR2@N`, or by hand with `scancel --signal=USR2 --batch`), forwards it to the
//! tasks, and when the step exits with [`REQUEUE_EXIT_CODE`] (the trainer checkpointed) requeues
//! the job with `scontrol requeue`, at most `max_num_timeout` times. The requeued job resumes
//! from its checkpoint (`trainer.resume: auto`). `flotilla run --resume-sweep DIR`
//! ([`crate::resume`]) re-submits, through [`SlurmLauncher`], the jobs of a sweep that did not
//! complete.

pub mod batches;
mod error;
pub mod pack;
mod queue;
mod quote;
mod render;
mod status;
mod submit;

pub use error::SlurmError;
pub use queue::{
    cancel, exit_marker, expand_ids, job_state, known_state, live_states, parse_sacct,
    parse_squeue, query, request_stop, scancel, LiveJob,
};
pub use quote::{quote_task, sbatch_quote, shell_quote};
pub use render::{
    format_time, load_template, render_script, render_with, sbatch_options, ScriptSpec,
    BUILTIN_TEMPLATE, BUILTIN_TEMPLATE_NAME, STOP_SIGNAL,
};
pub use status::{
    end_message, failure_message, forgotten_message, live_view, parse_srun_error, status,
    LOG_TAIL_LINES,
};
pub use submit::{
    job_specs, max_array_size, parse_max_array_size, submit, submit_scripts, submit_scripts_after,
    write_scripts, write_single_scripts, JobSpec, Script, SlurmOptions, Submission, SubmittedJob,
    DEFAULT_MAX_ARRAY_SIZE, SCRIPT_DIR,
};

/// Exit status of a task that checkpointed after a stop signal (`EX_TEMPFAIL`): the batch
/// script requeues the job.
pub use crate::REQUEUE_EXIT_CODE;
/// File in a job's `logs/` where the batch script writes `<id> <STATE> <exit status>` when the
/// job ends (not when it requeues itself): what `status` falls back on once the scheduler no
/// longer knows the job.
pub use flotilla_contract::layout::SLURM_EXIT_MARKER as EXIT_MARKER;

use crate::rundir::PreparedRun;
use crate::{JobOutcome, LaunchError, Launcher};
use flotilla_config::schema::Launcher as LauncherKind;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::process::{Command, Stdio};

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

impl Launcher for SlurmLauncher {
    fn name(&self) -> &'static str {
        LauncherKind::Slurm.as_str()
    }

    fn prepare(&mut self, run: &PreparedRun) -> Result<(), LaunchError> {
        self.scripts = write_scripts(&run.plan, &job_specs(run), &self.opts)?;
        Ok(())
    }

    fn launch(&mut self, run: &PreparedRun) -> Result<Vec<JobOutcome>, LaunchError> {
        if self.scripts.is_empty() {
            self.prepare(run)?;
        }
        let submissions =
            submit_scripts_after(&run.plan, &self.scripts, self.opts.dependency.as_deref())?;
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
