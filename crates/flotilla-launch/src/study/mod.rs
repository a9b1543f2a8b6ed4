//! Running an adaptive study: what is sampled and when a trial is pruned is `flotilla_study`'s
//! (spaces, samplers, pruner); this module runs the trials.
//!
//! - `file.rs`: the study as `study.json` holds it ([`StudyFile`]) and its [`summary`].
//! - `sampling.rs`: the search space ([`search_space`]) and the sampler; [`first_trials`].
//! - `drive.rs`: the study loop ([`drive_with`]): samples a trial whenever a slot is free,
//!   prepares its directory, reads its metric and asks the pruner at every new value, records
//!   each trial's end.
//! - `trial_runner.rs`: what runs the trials for the loop ([`TrialRunner`]): the local
//!   launcher's threads ([`LocalTrialRunner`]; a pruned trial gets SIGTERM, the built-in trainer
//!   checkpoints and exits) or one SLURM batch job per trial ([`SlurmTrialRunner`]).
//! - `run.rs`: the entry points. On the local launcher `flotilla run` drives the study itself
//!   ([`run_study`]); `--resume-sweep DIR` ([`resume_study`]) starts the trials that were
//!   running again from their own directories (the trainer resumes from its checkpoint) and
//!   samples on to `n_trials`. On SLURM `flotilla run` only creates the study and starts a
//!   detached driver (`flotilla study-drive DIR`, [`drive_slurm_study`]); `--resume-sweep DIR`
//!   starts a new driver when none is alive, which watches the jobs still in flight again and
//!   submits again those that ended without completing.
//! - [`detach`]: starting that detached driver process, and its lock.

pub mod detach;
mod drive;
mod file;
mod run;
mod sampling;
mod trial_runner;

pub use drive::drive_with;
pub use file::{summary, StudyFile, STUDY_FILE};
pub use run::{
    create_study, drive_slurm_study, is_slurm_study, resume_study, run_study, study_composer,
    StudyRun,
};
pub use sampling::{first_trials, search_space};
pub use trial_runner::{LocalTrialRunner, SlurmTrialRunner, TrialRunner, SLURM_POLL};
