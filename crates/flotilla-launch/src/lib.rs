//! Launching prepared jobs: the [`Launcher`] trait every launcher implements, the outcome of a
//! job ([`JobOutcome`], [`RankFailure`]), the task each rank runs ([`TaskCommand`]), and the
//! commands built on them: [`run`] (prepare the directories, then start or submit), [`resume`]
//! (start again what did not complete) and [`status`] (recorded state + directory markers + the
//! launcher's live view).
//!
//! The local launcher lives in [`local`]; the SLURM launcher in [`slurm`] plugs in through
//! [`launcher_for`] (start/submit, in `run`, above both launchers) and [`live_states`] (batched
//! squeue/sacct query). Adaptive studies are driven by [`study`].
//!
//! The modules build on one another bottom up: [`rundir`] (the directories and their files,
//! `task.json` included) below [`LaunchError`], the [`Launcher`] trait below the launchers that
//! implement it, and the commands (`run`, `resume`, `status`, [`study`]) on top.

pub mod after;
pub mod base_model;
pub mod hydra_job;
pub mod local;
pub mod memory;
pub mod preflight;
pub mod rundir;
pub mod settings;
pub mod slurm;
pub mod study;
pub mod user_task;

mod error;
mod launcher;
mod resume;
mod run;
mod status;
mod train_binary;

/// The exit status of a task that stopped on request after writing a checkpoint.
pub use flotilla_contract::exit::REQUEUE as REQUEUE_EXIT_CODE;

pub use error::LaunchError;
pub use launcher::{
    signal_name, JobOutcome, Launcher, RankFailure, TaskCommand, TaskExit, JOB_DIR_PLACEHOLDER,
};
pub use local::{Cancel, LocalLauncher, LocalOptions};
pub use resume::{prepared_job_from_dir, read_job_config, resume};
pub use run::{launcher_for, run, run_after, RunOptions, RunReport};
pub use status::{
    live_states, status, status_json, status_of_located, status_text, status_with_markers,
};
pub use train_binary::{locate_train_binary, locate_train_binary_in, TRAIN_BINARY_NAME};
