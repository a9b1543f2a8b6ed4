//! [`SlurmError`]: everything that can go wrong while rendering a script, submitting it or
//! asking the scheduler about jobs, and its conversion into the crate's
//! [`LaunchError`](crate::LaunchError).

use crate::rundir::RunDirError;
use crate::LaunchError;
use std::path::{Path, PathBuf};

/// What can go wrong while rendering, submitting or querying.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the sbatch template {}: {source}", path.display())]
    TemplateRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sbatch template {name}: {message}")]
    Template { name: String, message: String },
    #[error("compute.additional_parameters.{key}: {message}")]
    Parameter { key: String, message: String },
    #[error("{program} not found: run this on a SLURM login node (or use compute.launcher=local)")]
    CommandMissing { program: String },
    #[error("cannot run {program}: {source}")]
    CommandFailed {
        program: String,
        source: std::io::Error,
    },
    #[error("sbatch rejected {}: {stderr}{}", script.display(), submitted_note(.submitted))]
    Rejected {
        script: PathBuf,
        stderr: String,
        /// Ids of the arrays submitted before this one (already recorded in the plan).
        submitted: Vec<String>,
    },
    #[error("sbatch printed no job id for {} (output: '{output}')", script.display())]
    NoJobId { script: PathBuf, output: String },
    #[error("{command} failed: {stderr}")]
    Query { command: String, stderr: String },
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{}: not a sweep or run directory with a plan (sweep.json or job.json)", path.display())]
    NoPlan { path: PathBuf },
}

fn submitted_note(ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(
            " (already submitted and recorded: {}; `flotilla run --resume-sweep` submits the rest)",
            ids.join(", ")
        )
    }
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> SlurmError {
    SlurmError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl From<SlurmError> for LaunchError {
    fn from(e: SlurmError) -> Self {
        match e {
            SlurmError::RunDir(e) => LaunchError::RunDir(e),
            other => LaunchError::Launcher(other.to_string()),
        }
    }
}
