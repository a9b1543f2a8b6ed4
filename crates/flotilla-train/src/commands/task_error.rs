//! The task binary's error and its exit status, one match instead of searching error chains:
//! 2 ([`flotilla_contract::exit::USAGE`]) for the user's config or overrides (and data that
//! cannot be read as the config says: [`crate::data::DataError::is_input`]), 75
//! ([`flotilla_contract::exit::REQUEUE`]) for a stop on request after a checkpoint (the
//! launcher requeues, the same command resumes), 1 ([`flotilla_contract::exit::FAILURE`]) for
//! everything else, a libtorch failure (out of memory included) among them.

use crate::error::TrainError;
use crate::preempt::PreemptError;
use flotilla_config::ConfigError;
use flotilla_contract::exit::{self, error_message};

/// Why `flotilla-train` failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The config or an override is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A run directory's file cannot be created or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Training failed or stopped; `context` says which job and rank.
    #[error("{context}")]
    Train {
        context: String,
        #[source]
        source: TrainError,
    },
    /// A command's input is wrong (a missing directory, a malformed file), with the fix.
    #[error("{}", error_message(.0.as_ref()))]
    Usage(anyhow::Error),
    /// Anything else (consolidation, the communication benchmark), with its context chain.
    #[error("{}", error_message(.0.as_ref()))]
    Other(#[from] anyhow::Error),
}

impl TaskError {
    /// The process's exit status for this error.
    pub fn exit_status(&self) -> u8 {
        match self {
            TaskError::Config(_) | TaskError::Usage(_) => exit::USAGE,
            TaskError::Train {
                source: TrainError::Data(e),
                ..
            } if e.is_input() => exit::USAGE,
            TaskError::Train {
                source: TrainError::Preempt(PreemptError::Stopped { .. }),
                ..
            } => exit::REQUEUE,
            TaskError::Io { .. } | TaskError::Train { .. } | TaskError::Other(_) => exit::FAILURE,
        }
    }

    /// The stop report when training stopped on request (printed without `error:`).
    pub fn stopped(&self) -> Option<&PreemptError> {
        match self {
            TaskError::Train {
                source: TrainError::Preempt(stop @ PreemptError::Stopped { .. }),
                ..
            } => Some(stop),
            _ => None,
        }
    }

    /// The message with its causes, `a: b: c`, each once, as the CLI prints it.
    pub fn report(&self) -> String {
        match self {
            // their own message already holds the chain
            TaskError::Usage(_) | TaskError::Other(_) => self.to_string(),
            _ => error_message(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn statuses_follow_the_kind_of_failure() {
        let stopped = TaskError::Train {
            context: "training in run (rank 0 of 1)".into(),
            source: TrainError::Preempt(PreemptError::Stopped {
                reason: "SIGUSR2".into(),
                step: 7,
                checkpoint: PathBuf::from("run/checkpoints/step_7"),
            }),
        };
        assert_eq!(stopped.exit_status(), 75);
        assert!(stopped.stopped().is_some());
        let oom = TaskError::Train {
            context: "training in run (rank 1 of 2)".into(),
            source: TrainError::Libtorch {
                step: 4,
                out_of_memory: true,
                message: "CUDA out of memory".into(),
            },
        };
        assert_eq!(oom.exit_status(), 1);
        assert!(oom.stopped().is_none());
        let report = oom.report();
        assert!(
            report.starts_with(
                "training in run (rank 1 of 2): libtorch failed at step 4: CUDA out of memory"
            ),
            "{report}"
        );
        assert_eq!(TaskError::Other(anyhow::anyhow!("bad")).exit_status(), 1);
        assert_eq!(
            TaskError::Usage(anyhow::anyhow!("no such file")).exit_status(),
            2
        );
    }
}
