//! "Will it fit?": the memory a job of the built-in trainer needs per GPU and per node, worked
//! out before it starts, from its typed config alone (arithmetic; no libtorch).
//!
//! This module owns the estimate and the fit check: [`estimate`] gives every term of one rank's
//! memory (parameters, gradients, AdamW moments, FSDP buffers, activations,
//! logits and loss, workspaces, the CUDA context, the allocator margin), the peak per GPU with
//! the moment it happens, host memory per node, and the job's GPU; [`check`] is the refusal
//! `flotilla run` applies before it creates anything, with ranked [`Advice`] (each with its
//! new estimate). `flotilla plan --memory` prints [`render`]'s table or JSON.
//!
//! Where things live: `model` is the memory model itself (what `flotilla-train` holds, term by
//! term and moment by moment); `gpu` resolves a job's GPU (`compute.gpu_mem_gb`,
//! `compute.gpu_type` from the schema's GPU table, or a `compute.constraint` naming one);
//! `advice` tries the changes that shrink a job; `render` prints.

mod activations;
mod advice;
mod gpu;
mod model;
pub mod render;
mod units;

#[cfg(test)]
pub(crate) mod tests;

use flotilla_config::schema::{
    DistConfig, Dtype, JobConfig, ObjectiveConfig, Precision, ShardingStrategy,
};
use serde::Serialize;

pub use advice::{advise, Advice};
pub use gpu::{job_gpu, GpuMemory};
pub use model::{
    flat_groups, precision_bytes, Activations, FlatGroup, Moment, Phase, Step, TermKind, Units,
    ALLOCATOR_MARGIN, CUDA_CONTEXT_BYTES, NCCL_COMMUNICATOR_BYTES,
};

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// One term of the estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    pub term: TermKind,
    pub label: String,
    /// Its largest size during the step, in bytes.
    pub bytes: u64,
    /// Its size at the peak, in bytes.
    pub at_peak: u64,
}

/// A moment's total.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseTotal {
    pub phase: Phase,
    pub bytes: u64,
}

/// The memory of one job's ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Whether the ranks train on GPUs (else the device terms are host memory).
    pub gpu_job: bool,
    pub world_size: usize,
    pub ranks_per_node: usize,
    pub strategy: String,
    pub precision: String,
    pub micro_batch_size: usize,
    pub seq_len: usize,
    pub accumulation_steps: usize,
    pub activation_checkpointing: bool,
    /// Device terms with a size, in table order.
    pub terms: Vec<Term>,
    pub phases: Vec<PhaseTotal>,
    /// The peak per GPU (per rank), in bytes.
    pub peak_bytes: u64,
    pub peak_phase: Phase,
    pub host_terms: Vec<Term>,
    pub host_bytes_per_node: u64,
    /// `compute.mem_gb` in bytes (the host memory requested per node), when set.
    pub host_limit_bytes: Option<u64>,
    /// The memory of one of the job's GPUs, when known.
    pub gpu: Option<GpuMemory>,
    /// Whether the peak fits the GPU (`None`: CPU job or unknown GPU).
    pub fits: Option<bool>,
}

impl Estimate {
    /// The largest device term at the peak (the context and margin aside).
    pub fn largest_term(&self) -> Option<&Term> {
        self.terms
            .iter()
            .filter(|t| {
                !matches!(
                    t.term,
                    TermKind::CudaContext | TermKind::NcclBuffers | TermKind::AllocatorMargin
                )
            })
            .max_by_key(|t| t.at_peak)
    }
}

/// The peak per rank of `job` and when it happens: the arithmetic of the fit check, without
/// the labels and host terms of [`estimate`].
pub fn peak(job: &JobConfig) -> (u64, Phase) {
    Step::new(job)
        .moments()
        .into_iter()
        .map(|m| (m.total(), m.phase))
        .max_by_key(|(b, _)| *b)
        .unwrap_or((0, Phase::LossBackward))
}

/// The full estimate of `job`.
pub fn estimate(job: &JobConfig) -> Estimate {
    let step = Step::new(job);
    let moments = step.moments();
    let at_peak = moments
        .iter()
        .max_by_key(|m| m.total())
        .cloned()
        .expect("a step has moments");
    let peak_bytes = at_peak.total();
    let terms = TermKind::DEVICE
        .iter()
        .filter_map(|&t| {
            let bytes = moments.iter().map(|m| m.get(t)).max().unwrap_or(0);
            (bytes > 0).then(|| Term {
                term: t,
                label: label(job, &step, t),
                bytes,
                at_peak: at_peak.get(t),
            })
        })
        .collect();
    let (host, host_bytes_per_node) = step.host(peak_bytes);
    let host_terms = host
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(t, bytes)| Term {
            term: t,
            label: label(job, &step, t),
            bytes,
            at_peak: bytes,
        })
        .collect();
    let gpu = if step.gpu {
        job_gpu(&job.compute)
    } else {
        None
    };
    let fits = gpu.as_ref().map(|g| peak_bytes <= g.bytes);
    Estimate {
        gpu_job: step.gpu,
        world_size: job.compute.world_size(),
        ranks_per_node: job.compute.tasks_per_node,
        strategy: strategy_name(job),
        precision: match job.trainer.precision {
            Precision::Auto => format!("{} (precision auto)", job.precision()),
            p => p.to_string(),
        },
        micro_batch_size: job.trainer.micro_batch_size,
        seq_len: job.data.seq_len(),
        accumulation_steps: step.accum as usize,
        activation_checkpointing: step.checkpointing,
        terms,
        phases: moments
            .iter()
            .map(|m| PhaseTotal {
                phase: m.phase,
                bytes: m.total(),
            })
            .collect(),
        peak_bytes,
        peak_phase: at_peak.phase,
        host_terms,
        host_bytes_per_node,
        host_limit_bytes: job.compute.mem_gb.map(|g| g << 30),
        gpu,
        fits,
    }
}

/// `none`, `DDP`, or `FSDP <strategy>`.
pub fn strategy_name(job: &JobConfig) -> String {
    match &job.trainer.dist {
        DistConfig::None => "one process".into(),
        DistConfig::Ddp(_) => "DDP".into(),
        DistConfig::Fsdp(f) => format!(
            "FSDP {}{}",
            f.sharding_strategy,
            if f.cpu_offload { " + cpu_offload" } else { "" }
        ),
    }
}

fn dtype_name(bytes: u64, fp16: bool) -> &'static str {
    match (bytes, fp16) {
        (4, _) => "fp32",
        (_, true) => "fp16",
        _ => "bf16",
    }
}

/// The table's wording of a term for this job.
fn label(job: &JobConfig, step: &Step<'_>, t: TermKind) -> String {
    let fp16 = job.precision() == Precision::Fp16Mixed;
    let master = dtype_name(step.m, false);
    let compute = dtype_name(step.c, fp16);
    let fsdp = match &job.trainer.dist {
        DistConfig::Fsdp(f) => Some(f),
        _ => None,
    };
    let world = job.compute.world_size();
    let shard_note = match fsdp {
        Some(f) if world > 1 && f.sharding_strategy != ShardingStrategy::NoShard => {
            format!(", sharded {}", f.sharding_strategy)
        }
        _ => String::new(),
    };
    let named = |d: Option<Dtype>| match d {
        Some(Dtype::Float32) => "fp32",
        Some(Dtype::Bfloat16) => "bf16",
        Some(Dtype::Float16) => "fp16",
        None => compute,
    };
    let param = named(fsdp.and_then(|f| f.param_dtype));
    let reduce = named(fsdp.and_then(|f| f.reduce_dtype));
    let act_dtype = if fsdp.is_some() { param } else { compute };
    let layers = job.model.num_hidden_layers;
    match t {
        TermKind::Params if job.peft.lora().is_some() => {
            let frozen = if fsdp.is_some() { param } else { compute };
            format!("parameters ({frozen} frozen base, {master} LoRA adapters{shard_note})")
        }
        TermKind::Params => format!("parameters ({master}{shard_note})"),
        TermKind::Reference if job.peft.lora().is_some() => {
            format!("DPO reference: a frozen copy of the adapters ({compute})")
        }
        TermKind::Reference => {
            let dtype = if fsdp.is_some() { param } else { compute };
            format!("DPO reference: a frozen copy of the parameters ({dtype}{shard_note})")
        }
        TermKind::ComputeCopies if job.peft.lora().is_some() => {
            format!("{compute} compute copies of the adapters")
        }
        TermKind::ComputeCopies => format!("{compute} compute copies of the parameters"),
        TermKind::Grads => match fsdp {
            Some(_) => format!("gradients ({master}{shard_note})"),
            None if job.peft.lora().is_some() => "gradients (fp32, adapters only)".into(),
            None => "gradients (fp32 accumulators)".into(),
        },
        TermKind::GradAccumulators if job.model.tie_word_embeddings && fsdp.is_some() => {
            format!("{param} gradients of the unit in backward (the tied embedding's fp32)")
        }
        TermKind::GradAccumulators if fsdp.is_some() => {
            format!("{param} gradients of the unit in backward")
        }
        TermKind::GradAccumulators => "fp32 gradients of the unit in backward".into(),
        TermKind::Optimizer if job.peft.lora().is_some() => {
            format!("AdamW moments ({master}, adapters only{shard_note})")
        }
        TermKind::Optimizer => format!("AdamW moments ({master}{shard_note})"),
        TermKind::Gathered => format!("FSDP all-gather buffers ({param})"),
        TermKind::UnshardedGrads => {
            format!("unsharded gradient in reduce-scatter ({reduce}, one group)")
        }
        TermKind::Activations => format!(
            "activations ({act_dtype}, {layers} blocks{}, micro batch {} x {})",
            if step.checkpointing {
                " checkpointed"
            } else {
                ""
            },
            job.trainer.micro_batch_size,
            job.data.seq_len()
        ),
        TermKind::Recompute => "block recomputed in backward (checkpointing)".into(),
        TermKind::Logits if matches!(job.objective, ObjectiveConfig::Sft) => {
            let tokens = job.trainer.micro_batch_size * job.data.seq_len();
            format!(
                "logits ({act_dtype}, vocab {}, chunks of {} tokens)",
                job.model.vocab_size,
                job.model.loss_chunk_rows(tokens)
            )
        }
        TermKind::Logits => format!("logits ({act_dtype}, vocab {})", job.model.vocab_size),
        TermKind::Loss => "loss: fp32 log-probabilities".into(),
        TermKind::LossBackward if matches!(job.objective, ObjectiveConfig::Sft) => {
            "loss backward: fp32 gradients over the vocabulary, and the head's".into()
        }
        TermKind::LossBackward => "loss backward: fp32 gradients over the vocabulary".into(),
        TermKind::BackwardWorkspace => "one block's backward".into(),
        TermKind::OptimizerWorkspace => "AdamW temporaries".into(),
        TermKind::EvalGather => format!("one unit's groups gathered to evaluate ({param})"),
        TermKind::EvalForward => format!("evaluation forward ({act_dtype})"),
        TermKind::CheckpointGather => {
            format!("one group gathered on rank 0 to checkpoint ({master})")
        }
        TermKind::StartupParams => "one group broadcast at start-up (sync_module_states)".into(),
        TermKind::CudaContext => "CUDA context, cuBLAS".into(),
        TermKind::NcclBuffers => "NCCL buffers (estimate)".into(),
        TermKind::AllocatorMargin => {
            format!("allocator margin ({:.0}%)", model::ALLOCATOR_MARGIN * 100.0)
        }
        TermKind::Process => format!(
            "{} rank processes ({})",
            job.compute.tasks_per_node,
            if step.gpu {
                "libtorch, CUDA"
            } else {
                "libtorch and their tensors"
            }
        ),
        TermKind::Data => "training data and batches".into(),
        TermKind::Offloaded => "offloaded shards, gradients, AdamW (cpu_offload)".into(),
        TermKind::CheckpointWrite => "writing a checkpoint (streamed by chunks)".into(),
        TermKind::ResumeRead => "resuming: each rank reads its own elements".into(),
    }
}

/// Why `flotilla run` refuses a job.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The estimated peak exceeds the job's GPU; the message names the largest term and the
    /// ranked advice.
    #[error("{0}")]
    DoesNotFit(String),
}

/// The fit check of `flotilla run`: nothing for a CPU job, a job with `compute.check_memory:
/// false`, or one whose GPU is unknown; else an error when the estimated peak exceeds one GPU,
/// naming `what` (the job), the largest term and the ranked advice with their estimates.
pub fn check(job: &JobConfig, what: &str) -> Result<(), MemoryError> {
    if !job.compute.check_memory || !job.runs_on_gpu() {
        return Ok(());
    }
    let Some(gpu) = job_gpu(&job.compute) else {
        return Ok(());
    };
    let (bytes, _) = peak(job);
    if bytes <= gpu.bytes {
        return Ok(());
    }
    let est = estimate(job);
    let advice = advise(job, gpu.bytes);
    Err(MemoryError::DoesNotFit(render::refusal(
        what, &est, &gpu, &advice,
    )))
}
