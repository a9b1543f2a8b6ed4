//! Parallelism over the unit engine, applied in one place: the [`engine`] (forward and backward
//! unit by unit, with the [`Strategy`] hooks), the weights of a rank behind one trait
//! ([`weights`]: [`replicated`] for one process and DDP, [`fsdp`] sharded over the flat groups
//! of [`layout`]), collectives over tensors ([`tensor_comm`]), a step's scalars read once
//! ([`readings`]), freeing storage in place
//! ([`storage_shim`]), and [`parallelize`](mod@parallelize), which turns a job's `trainer.dist`
//! into one of them. The model knows nothing of this module.

pub mod engine;
pub mod fsdp;
pub mod layout;
pub mod parallelize;
pub mod readings;
pub mod replicated;
pub mod storage_shim;
pub mod tensor_comm;
pub mod weights;

pub use engine::{Engine, EngineOptions, LossChunks, RouterAux, SingleProcess, Strategy};
pub use parallelize::{parallelize, DistContext};
pub use weights::{HeldTensors, MemoryReport, ParallelWeights};
