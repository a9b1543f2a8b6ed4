//! The training task: the Llama-style [`model`], the [`data`] pipelines, collectives over
//! tensors ([`tensor_comm`], on `flotilla_comm`'s communicators), the learning-rate [`schedule`], the
//! [`optim`]izer (AdamW and gradient clipping), the unit [`engine`] (forward and backward unit
//! by unit, gradient accumulation, activation checkpointing, strategy hooks), the weights of a
//! rank ([`weights`]: [`replicated`] for one process and DDP, [`fsdp`] sharded) as
//! [`parallelize`](mod@parallelize) builds them, the [`trainer`] loop with its fp16
//! [`loss_scale`] (its `metrics.csv` rows are `flotilla_contract::metrics`'), its [`checkpoint`]s, a run in a run directory
//! ([`fit`](mod@fit): evaluation, checkpointing, resuming; [`preempt`]ion), the
//! `flotilla train` job ([`task`]) and `flotilla bench comm` ([`comm_bench`]); the starting
//! weights and resumed state read by ranges ([`param_source`] over [`safetensors_io`]) and
//! each rank's peak host memory by phase ([`host_memory`]). This file owns the crate's error type and the safetensors helpers that name the file in their
//! errors.

pub mod checkpoint;
pub mod comm_bench;
pub mod data;
pub mod data_show;
pub mod engine;
pub mod fit;
pub mod fsdp;
pub mod fsdp_layout;
pub mod generate;
pub mod host_memory;
pub mod lora;
pub mod loss_scale;
pub mod model;
pub mod optim;
pub mod parallelize;
pub mod param_source;
pub mod preempt;
pub mod progress;
pub mod replicated;
pub mod safetensors_io;
pub mod schedule;
pub mod storage_shim;
pub mod task;
pub mod task_error;
pub mod tensor_comm;
pub mod torch_guard;
pub mod trainer;
pub mod weights;

pub use flotilla_contract::LIBTORCH_VERSION;

use std::path::PathBuf;

pub use engine::{Engine, EngineOptions, SingleProcess, Strategy};
pub use fit::{fit, resume, EvalSet, FitOptions};
pub use flotilla_contract::metrics::{EvalMetrics, MetricsRow, MetricsWriter};
pub use loss_scale::LossScaler;
pub use optim::{clip_grad_norm, AdamW, AdamWConfig};
pub use parallelize::{parallelize, DistContext};
pub use progress::Progress;
pub use schedule::Schedule;
pub use trainer::{torch_device, Trainer};
pub use weights::{HeldTensors, MemoryReport, ParallelWeights};

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
    #[error(transparent)]
    Metrics(#[from] flotilla_contract::metrics::MetricsError),
    /// A stop on request (SIGUSR2/SIGTERM) after a checkpoint, or a handler that cannot be set.
    #[error(transparent)]
    Preempt(#[from] preempt::PreemptError),
    #[error(transparent)]
    Comm(#[from] flotilla_comm::comm::CommError),
    #[error("rendezvous with the other ranks (MASTER_ADDR:MASTER_PORT)")]
    Store(#[from] flotilla_comm::store::StoreError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Safetensors(#[from] safetensors_io::SafetensorsError),
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
