//! [`LaunchError`]: anything that goes wrong while preparing, starting, supervising or querying
//! jobs, whatever the launcher.

use crate::rundir::RunDirError;
use flotilla_config::ConfigError;

/// Anything that goes wrong while starting, supervising or querying jobs.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("job {num}: cannot start rank {rank} ({program}): {error}")]
    Spawn {
        num: usize,
        rank: usize,
        program: String,
        error: std::io::Error,
    },
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    /// A launcher that cannot do what the config asks.
    #[error("{0}")]
    Unsupported(String),
    /// The training task binary cannot be found; the message says where it looked and the fix.
    #[error("{0}")]
    TaskBinary(String),
    /// A launcher's own failure (e.g. `sbatch` refusing a script), with its message.
    #[error("{0}")]
    Launcher(String),
    /// A job's `task.json` cannot be read.
    #[error("{0}")]
    Task(String),
}

impl From<ConfigError> for LaunchError {
    fn from(e: ConfigError) -> Self {
        LaunchError::RunDir(RunDirError::Config(e))
    }
}

impl LaunchError {
    /// The config error behind this failure, when the config or an override is at fault.
    pub fn as_config(&self) -> Option<&ConfigError> {
        match self {
            LaunchError::RunDir(RunDirError::Config(e)) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn io(what: impl Into<String>, error: std::io::Error) -> LaunchError {
        LaunchError::Io {
            what: what.into(),
            error,
        }
    }
}
