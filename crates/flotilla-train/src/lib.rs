//! The training task, grouped along its data flow; each group may use only those above it in
//! this list (checked by the workspace's `tests/module_dag.rs`):
//!
//! - [`safetensors_io`]: the safetensors format, read by byte ranges and written streamed;
//!   [`host_memory`], [`progress`] and [`preempt`]: a rank's peak memory, its progress bar and
//!   stops on request, needing nothing of the rest;
//! - [`model`]: the architectures as units over shared layers (one file per family), their
//!   Hugging Face names and `config.json`; it knows nothing of parallelism;
//! - [`data`]: datasets, tokenizers, chat templates, batches;
//! - [`objective`]: what turns a forward's logits and a batch into the loss;
//! - [`error`]: the trainer's error type, and libtorch's exceptions as errors;
//! - [`state`]: a model's tensors in and out of files (parameter sources read by ranges,
//!   Hugging Face and PEFT directories);
//! - [`optim`]: AdamW and clipping, the learning-rate schedule, fp16 loss scaling;
//! - [`parallel`]: the unit engine and its strategies (one process, DDP, FSDP and its flat
//!   layouts), collectives over tensors, and [`parallelize`](parallel::parallelize()), the one
//!   place that applies them;
//! - [`trainer`]: one optimizer step of whichever weights the job holds;
//! - [`reference`](mod@reference): preference tuning's precomputed reference log-probabilities, cached in
//!   the run directory;
//! - [`checkpoint`]: checkpoints (full or sharded, resumable on any world size) and `final/`;
//! - [`fit`](mod@fit): the loop: evaluation, checkpointing, resuming, `metrics.csv`;
//! - [`commands`]: the `flotilla-train` binary's commands (`train`, `generate`, `data show`,
//!   `bench comm`) and their exit statuses.

pub mod safetensors_io;

pub mod cuda;
pub mod host_memory;
pub mod preempt;
pub mod progress;

pub mod model;

pub mod data;

pub mod objective;

pub mod error;

pub mod state;

pub mod optim;

pub mod parallel;

pub mod trainer;

pub mod reference;

pub mod checkpoint;

pub mod fit;

pub mod commands;

pub use flotilla_contract::LIBTORCH_VERSION;

pub use error::TrainError;
pub use fit::{fit, resume, EvalSet, FitOptions};
pub use flotilla_contract::metrics::{EvalMetrics, MetricsRow, MetricsWriter};
pub use optim::{clip_grad_norm, AdamW, AdamWConfig, LossScaler, Schedule};
pub use parallel::{
    parallelize, DistContext, Engine, EngineOptions, HeldTensors, LossChunks, MemoryReport,
    ParallelWeights, SingleProcess, Strategy,
};
pub use progress::Progress;
pub use trainer::{torch_device, Trainer};
