//! Training: the learning-rate [`schedule`], the [`optim`]izer (AdamW and gradient clipping)
//! and the unit [`engine`] (forward and backward unit by unit, gradient accumulation,
//! activation checkpointing, strategy hooks), and the single-process [`trainer`] loop with its
//! `metrics.csv` rows, its [`checkpoint`]s, and a [`run`] in a run directory (evaluation,
//! checkpointing, resuming). This file owns the module's error type.

pub mod checkpoint;
pub mod data;
pub mod distributed;
pub mod engine;
pub mod fit;
pub mod fsdp;
pub mod fsdp_layout;
pub mod model;
pub mod optim;
pub mod parallelize;
pub mod preempt;
pub mod progress;
pub mod replicated;
pub mod schedule;
pub mod storage_shim;
pub mod task;
pub mod trainer;
pub mod weights;

pub use flotilla_launch::LIBTORCH_VERSION;

use std::path::PathBuf;

pub use engine::{Engine, EngineOptions, SingleProcess, Strategy};
pub use fit::{fit, resume, EvalMetrics, EvalSet, FitOptions, RunMetricsWriter, RunRow};
pub use optim::{clip_grad_norm, AdamW, AdamWConfig};
pub use parallelize::{parallelize, DistContext};
pub use progress::Progress;
pub use schedule::Schedule;
pub use trainer::{torch_device, LossScaler, MetricsWriter, StepMetrics, Trainer};
pub use weights::{MemoryReport, ParallelWeights};

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
    /// A configuration this trainer cannot run yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("metrics.csv: {0}")]
    Csv(#[from] csv::Error),
    /// A stop on request (SIGUSR2/SIGTERM) after a checkpoint, or a handler that cannot be set.
    #[error(transparent)]
    Preempt(#[from] preempt::PreemptError),
    #[error(transparent)]
    Comm(#[from] crate::distributed::comm::CommError),
    #[error("rendezvous with the other ranks (MASTER_ADDR:MASTER_PORT)")]
    Store(#[from] crate::distributed::store::StoreError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// Writes named tensors to a safetensors file; errors name the file.
pub(crate) fn write_safetensors(
    path: &std::path::Path,
    tensors: &[(String, tch::Tensor)],
) -> Result<(), TrainError> {
    tch::Tensor::write_safetensors(tensors, path).map_err(|source| TrainError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads every tensor of a safetensors file; errors name the file.
pub(crate) fn read_safetensors(
    path: &std::path::Path,
) -> Result<Vec<(String, tch::Tensor)>, TrainError> {
    tch::Tensor::read_safetensors(path).map_err(|source| TrainError::File {
        path: path.to_path_buf(),
        source,
    })
}
