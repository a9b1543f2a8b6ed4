//! The trainer's error ([`TrainError`]: every failure of a training step, a checkpoint or a
//! start-up, wrapping the model's, the data's, the files' and the communicators' own errors) and
//! libtorch's exceptions turned into it ([`torch_guard`]).

pub mod torch_guard;

use std::path::PathBuf;

use crate::data::DataError;
use crate::model::ModelError;
use crate::preempt::PreemptError;
use crate::safetensors_io::SafetensorsError;

/// Errors of the trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A gradient or state tensor whose shape disagrees with its parameter.
    #[error("`{name}`: expected shape {expected:?}, found {found:?}")]
    Shape {
        name: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    /// An optimizer state that cannot be restored.
    #[error("optimizer state: {0}")]
    BadState(String),
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: tch::TchError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The rank's device cannot be set up as asked (binding it, a CUDA debug setting).
    #[error("device: {0}")]
    Device(String),
    /// A configuration this trainer cannot run yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Metrics(#[from] flotilla_contract::metrics::MetricsError),
    /// A stop on request (SIGUSR2/SIGTERM) after a checkpoint, or a handler that cannot be set.
    #[error(transparent)]
    Preempt(#[from] PreemptError),
    #[error(transparent)]
    Comm(#[from] flotilla_comm::comm::CommError),
    #[error("rendezvous with the other ranks (MASTER_ADDR:MASTER_PORT)")]
    Store(#[from] flotilla_comm::store::StoreError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// libtorch threw (through a panic of tch's or a fallible call) while the job was at
    /// `step`; see [`torch_guard`].
    #[error(
        "libtorch failed at step {step}: {message}{}",
        if *out_of_memory {
            "; the device ran out of memory: `flotilla plan --memory` with this job's overrides \
             shows its estimate and what would fit (a smaller micro batch, activation \
             checkpointing, FSDP)"
        } else {
            ""
        }
    )]
    Libtorch {
        step: u64,
        out_of_memory: bool,
        message: String,
    },
}

impl TrainError {
    /// Whether the input is at fault (a model directory, checkpoint or data file that is
    /// missing, malformed or of a kind flotilla does not run): exit status 2 where a command
    /// reads it, not 1.
    pub fn is_bad_input(&self) -> bool {
        match self {
            TrainError::Model(e) => e.is_bad_input(),
            TrainError::Safetensors(e) => e.is_bad_input(),
            TrainError::Data(_) | TrainError::BadState(_) | TrainError::Shape { .. } => true,
            TrainError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            _ => false,
        }
    }
}
