//! Typed validation of the composed job config: the `seed`, `model`, `trainer` (with
//! `trainer.dist`), `data` and `compute` sections that `conf/` defines; for a job that runs the
//! user's own program, `flotilla.task` and `compute` alone ([`validate_user_task`]).
//!
//! [`validate`] takes the resolved job tree (the runtime `flotilla:`/`hydra:` node removed,
//! interpolations resolved) and returns a typed [`JobConfig`], or a [`SchemaError`] listing
//! every problem at once: unknown keys (with a near-miss suggestion), wrong types, values outside
//! an enum, mandatory `???` values left unset, missing keys, and the semantic checks that belong
//! to the config (head counts, batch divisibility, world size, sequence length). Each problem
//! names the dotted key, where the offending value was set, and how to fix it. Top-level keys
//! other than the five sections and `seed` are the user's own and are left alone.
//!
//! This module owns the schema; the files under `conf/` must agree with it (a test checks that
//! every shipped preset validates).
//!
//! Where things live: `types` declares the typed sections and enums (and how each is read
//! from a node); `from_node` is the reading machinery they share (the `FromNode` trait, its
//! impls for scalars, lists and maps, and the collection of problems); `checks` holds
//! [`validate`] and the semantic rules; `messages` words the problems (origins, value display,
//! near-miss suggestions); `gpus` is the table of GPU models `compute.gpu_type` names;
//! `architecture` is what the Hugging Face architectures add to Llama (biases, a sliding window)
//! and how a `config.json` says which one a model is.
//! `rope` declares the rope types and `model.rope_scaling`, which keys each type reads, and the
//! checks of a config's rotary embeddings.
//! `runtime_mandatory` refuses the `???` values of the runtime node that hydra-core itself reads
//! ([`check_runtime_mandatory`]).

mod architecture;
mod checks;
mod from_node;
mod gpus;
pub mod hf_config;
mod loss_chunks;
mod messages;
mod moe;
mod objective;
mod peft;
mod precision;
mod rope;
mod runtime_mandatory;
mod shard_size;
mod tokenizer_spec;
mod types;

#[cfg(test)]
mod tests;

use crate::node::Origin;
use std::fmt;

pub use architecture::{hf_architecture, AttentionBiases, HfArchitecture, HfFieldError};
pub use checks::{
    starts_known_launcher, validate, validate_user_task, BYTE_TOKENIZER_IDS, BYTE_VOCAB,
    MAX_ARITHMETIC_DIGITS, USER_TASK_COMPUTE_DEFAULTS,
};
pub use gpus::{gpu_model, gpu_names, GpuModel, GPU_MODELS};
pub use moe::{lora_moe_problem, MoeConfig, DEFAULT_ROUTER_AUX_LOSS_COEF};
pub use objective::{DpoConfig, DpoLossType, ObjectiveConfig, ObjectiveKind, ReferenceModel};
pub use rope::RopeProblem;
pub use runtime_mandatory::{check_runtime_mandatory, RuntimeMode};
pub use shard_size::{ShardSize, DEFAULT_MAX_SHARD_SIZE};
pub use types::{
    ArithmeticData, AutoWrapPolicy, Backend, BackwardPrefetch, ChatData, ChatFormat, ComputeConfig,
    ConfigArg, DataConfig, DataKind, DataSource, DdpConfig, Device, DistConfig, DistMode, Dtype,
    ExpertTargets, FsdpConfig, JobConfig, JsonlData, Launcher, LoraConfig, LoraModule, LrSchedule,
    ModelConfig, Overflow, PackedAttention, PeftConfig, PeftMethod, Precision, Resume, RopeScaling,
    RopeType, SaveDtype, SavedModule, ShardingStrategy, StateDictType, TaskConfig, TaskRanks,
    TextData, TokenDtype, TokenizerSpec, TokensData, TrainOn, TrainerConfig,
};
pub use types::{
    LayerType, ModelType, PreferenceData, ProcessGroup, RecordSelection, TruncationMode,
};

/// What kind of problem a [`Problem`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// A key the schema does not know (or one that belongs to another `mode`/`kind`).
    UnknownKey,
    /// A required key is absent.
    MissingKey,
    /// A value of the wrong type.
    WrongType,
    /// A string outside an enum's allowed values.
    BadChoice,
    /// A mandatory value left as `???`.
    Mandatory,
    /// A well-typed value that breaks a rule: a range, or a relation with another key.
    Invalid,
}

/// One problem found by [`validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// Dotted key of the offending value (`trainer.lr`, `compute.setup[0]`).
    pub key: String,
    /// Where the offending value was set (for a missing key: its parent's origin).
    pub origin: Origin,
    /// The full message: key, what is wrong, where it was set, and the fix.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Every problem [`validate`] found; `Display` prints one per line.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct SchemaError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&p.message)?;
        }
        Ok(())
    }
}
