//! The memory model of one rank of the built-in trainer: what `flotilla-train` holds, tensor by
//! tensor, at each moment of a training step that can be its peak, worked out from the typed
//! job config alone. Every figure follows the code it models (named in each term's doc), not
//! the textbook: where the trainer holds more than a user would expect, the term says so.
//!
//! A step runs the engine's units (the embedding, each decoder block, the final norm with the
//! head) forward, then backward in reverse, then clips and takes the AdamW step; evaluation and
//! checkpoints happen between steps. The moments measured ([`Phase`]) are the start of the
//! backward pass (every activation held, the loss gradient being formed), each block's
//! backward, the end of the backward pass (gradient communication in flight), the optimizer
//! step, an evaluation, a checkpoint, and the start-up that builds the weights. A phase's total
//! is the sum of the terms alive then; the peak is the largest total.

use std::ops::Range;

pub use super::activations::Activations;
pub use super::units::Units;

use flotilla_config::schema::{
    DataConfig, DdpConfig, DistConfig, Dtype, FsdpConfig, JobConfig, Precision, Resume,
    ShardingStrategy, StateDictType,
};

/// The CUDA context and cuBLAS workspaces of one rank: a fixed figure (a CUDA 12 context with
/// lazy module loading takes 0.4–0.6 GiB on an H100, cuBLAS a few hundred MiB more).
pub const CUDA_CONTEXT_BYTES: u64 = 1 << 30;

/// NCCL's device buffers of one communicator of two or more ranks, allocated when it connects
/// (the trainer warms each communicator up right after init, so they exist before the first
/// step): per channel and peer connection a buffer of each protocol (`NCCL_BUFFSIZE`, 4 MiB, for
/// Simple; about as much for LL128; less for LL), over the 16 to 32 channels NCCL opens between
/// the GPUs of an NVLink node: an estimate, 512 MiB, to be checked against a GPU's
/// `memory_reserved` outside the caching allocator. A communicator of one rank connects to
/// nobody.
pub const NCCL_COMMUNICATOR_BYTES: u64 = 1 << 29;

/// Elements of a tensor rank 0 copies to the host at a time while writing a checkpoint
/// (`flotilla-train`'s `SafetensorsWriter`).
pub const WRITE_CHUNK_ELEMENTS: u64 = 1 << 24;

/// The caching allocator's rounding and fragmentation, as a share of the tensor bytes alive.
pub const ALLOCATOR_MARGIN: f64 = 0.05;

/// Host memory of one rank's process: the libtorch and CUDA libraries and their host-side
/// state (GPU ranks), or libtorch alone (CPU ranks).
pub const PROCESS_HOST_BYTES_GPU: u64 = 5 << 29;
pub const PROCESS_HOST_BYTES_CPU: u64 = 1 << 29;

/// What a term is. The order is the order of the printed table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TermKind {
    /// Master parameters (`replicated.rs` `Replicated::params`; FSDP: `fsdp.rs` `Group::shard`).
    Params,
    /// Low-precision copies the units compute with (mixed precision, replicated weights):
    /// `ReplicatedStrategy::params_for` casts each unit's parameters, and the unit's saved
    /// graph keeps the copy until its backward. A tied embedding is cast twice (by the
    /// embedding and by the head).
    ComputeCopies,
    /// Gradients for the optimizer: the engine's fp32 accumulators (`engine.rs`, whatever the
    /// precision, bf16-true included); FSDP: the reduced shards in the master dtype, present
    /// from the first micro-batch's reduce-scatter (`Fsdp::settle_reduction`).
    Grads,
    /// FSDP: the engine's unsharded fp32 gradients of the unit whose backward runs (and, for a
    /// tied embedding, from the head's backward to the embedding's); they are reduce-scattered
    /// on every micro-batch, so none outlives its unit's backward.
    GradAccumulators,
    /// AdamW's two moments, in the master dtype (`optim.rs`; FSDP: per shard).
    Optimizer,
    /// Preference tuning's frozen reference (`objective: dpo`, `reference: auto`): a copy of
    /// the trained parameters in the compute dtype (`Replicated::keep_reference`; FSDP: of
    /// each trained group's shard in the param dtype); none for a new LoRA adapter (the base
    /// with the adapters off) or a precomputed reference.
    Reference,
    /// FSDP all-gather buffers held (`Fsdp::issue_gather`): the groups the unit being computed
    /// reads, and the one prefetched (SHARD_GRAD_OP keeps every group until the step ends).
    /// `limit_all_gathers` bounds the gathers in flight (two), not the buffers held, so it does
    /// not change this term.
    Gathered,
    /// FSDP: the unsharded gradient (reduce dtype) of the group whose reduce-scatter is in
    /// flight (one at a time: the next waits for it), and a multi-unit group's gradient being
    /// assembled.
    UnshardedGrads,
    /// Activations of one micro-batch held between forward and backward.
    Activations,
    /// Activation checkpointing: the block being recomputed in the backward pass.
    Recompute,
    /// The head's logits, held by the engine until the head's backward.
    Logits,
    /// The loss: fp32 log-probabilities over the vocabulary saved by log-softmax.
    Loss,
    /// The loss backward: the fp32 gradients over the vocabulary of the NLL and log-softmax.
    LossBackward,
    /// One block's backward: gradients of its activations and of its weights.
    BackwardWorkspace,
    /// AdamW's temporaries on the largest tensor (`adamw_update`).
    OptimizerWorkspace,
    /// FSDP evaluation: the groups one unit reads, gathered in the master dtype
    /// (`Fsdp::forward_eval`).
    EvalGather,
    /// The evaluation forward (no gradients, in the master dtype): replicated weights run one
    /// micro-batch at a time; FSDP walks the units once for all of the rank's evaluation
    /// micro-batches, whose hidden states are alive together.
    EvalForward,
    /// FSDP with `state_dict_type: full` (and the final model): the largest group gathered on
    /// rank 0's device in the master dtype (`Fsdp::visit_full`, one group and one part at a
    /// time; the other ranks hold a shard's worth).
    CheckpointGather,
    /// Start-up beyond the weights themselves: each rank builds its replica or its shards
    /// from the source by ranges (`param_source.rs`), so nothing, unless FSDP's
    /// `sync_module_states` has rank 0 read and broadcast each group whole (one group at a
    /// time, on every rank).
    StartupParams,
    /// The CUDA context and cuBLAS workspaces.
    CudaContext,
    /// NCCL's buffers: [`NCCL_COMMUNICATOR_BYTES`] for each communicator of two or more ranks
    /// the job builds (the world's; HYBRID_SHARD's node and cross-node groups besides).
    NcclBuffers,
    /// The caching allocator's rounding and fragmentation.
    AllocatorMargin,
    /// Host: each rank's process (libraries and runtime).
    Process,
    /// Host: each rank's training data held in memory.
    Data,
    /// Host: FSDP `cpu_offload`: the shards, their gradients, AdamW moments and temporaries.
    Offloaded,
    /// Host: rank 0 writing a checkpoint or the final model copies at most 16M elements of a
    /// tensor at a time to the host (`SafetensorsWriter::write`).
    CheckpointWrite,
    /// Host: resuming, every rank reads only the elements it holds, one parameter's piece at a
    /// time (`CheckpointFiles`): replicated weights a whole parameter, FSDP its part of it.
    ResumeRead,
}

impl TermKind {
    /// Device terms, in table order.
    pub const DEVICE: [TermKind; 22] = [
        TermKind::Params,
        TermKind::ComputeCopies,
        TermKind::Grads,
        TermKind::GradAccumulators,
        TermKind::Optimizer,
        TermKind::Reference,
        TermKind::Gathered,
        TermKind::UnshardedGrads,
        TermKind::Activations,
        TermKind::Recompute,
        TermKind::Logits,
        TermKind::Loss,
        TermKind::LossBackward,
        TermKind::BackwardWorkspace,
        TermKind::OptimizerWorkspace,
        TermKind::EvalGather,
        TermKind::EvalForward,
        TermKind::CheckpointGather,
        TermKind::StartupParams,
        TermKind::CudaContext,
        TermKind::NcclBuffers,
        TermKind::AllocatorMargin,
    ];

    /// The snake_case key of the JSON output.
    pub fn key(self) -> &'static str {
        match self {
            TermKind::Params => "params",
            TermKind::ComputeCopies => "compute_copies",
            TermKind::Grads => "grads",
            TermKind::GradAccumulators => "grad_accumulators",
            TermKind::Optimizer => "optimizer",
            TermKind::Reference => "reference",
            TermKind::Gathered => "gathered",
            TermKind::UnshardedGrads => "unsharded_grads",
            TermKind::Activations => "activations",
            TermKind::Recompute => "recompute",
            TermKind::Logits => "logits",
            TermKind::Loss => "loss",
            TermKind::LossBackward => "loss_backward",
            TermKind::BackwardWorkspace => "backward_workspace",
            TermKind::OptimizerWorkspace => "optimizer_workspace",
            TermKind::EvalGather => "eval_gather",
            TermKind::EvalForward => "eval_forward",
            TermKind::CheckpointGather => "checkpoint_gather",
            TermKind::StartupParams => "startup_params",
            TermKind::CudaContext => "cuda_context",
            TermKind::NcclBuffers => "nccl_buffers",
            TermKind::AllocatorMargin => "allocator_margin",
            TermKind::Process => "process",
            TermKind::Data => "data",
            TermKind::Offloaded => "offloaded",
            TermKind::CheckpointWrite => "checkpoint_write",
            TermKind::ResumeRead => "resume_read",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const N_TERMS: usize = TermKind::ResumeRead as usize + 1;

/// A moment of the step that can be its peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The start of the backward pass: every activation, the logits and the loss held, the
    /// loss gradient being formed.
    LossBackward,
    /// A decoder block's backward (the worst block).
    Backward,
    /// The end of the backward pass: gradient buckets or unsharded gradients in flight.
    EndOfBackward,
    /// Gradient clipping and the AdamW step.
    OptimizerStep,
    /// An evaluation between steps.
    Evaluation,
    /// A checkpoint between steps.
    Checkpoint,
    /// Building the weights, before the first step.
    Startup,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::LossBackward => "loss backward",
            Phase::Backward => "block backward",
            Phase::EndOfBackward => "end of backward",
            Phase::OptimizerStep => "optimizer step",
            Phase::Evaluation => "evaluation",
            Phase::Checkpoint => "checkpoint",
            Phase::Startup => "start-up",
        }
    }
}

/// Bytes of each term at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Moment {
    pub phase: Phase,
    bytes: [u64; N_TERMS],
}

impl Moment {
    fn new(phase: Phase) -> Self {
        Self {
            phase,
            bytes: [0; N_TERMS],
        }
    }

    fn add(&mut self, term: TermKind, bytes: u64) {
        self.bytes[term.index()] += bytes;
    }

    /// Bytes of `term` at this moment.
    pub fn get(&self, term: TermKind) -> u64 {
        self.bytes[term.index()]
    }

    /// Bytes of every device term at this moment.
    pub fn total(&self) -> u64 {
        TermKind::DEVICE.iter().map(|t| self.get(*t)).sum()
    }

    /// Adds the fixed context, `communicators` NCCL communicators' buffers and the allocator
    /// margin over the tensors (GPU ranks).
    fn finish(&mut self, gpu: bool, communicators: u64) {
        if gpu {
            let tensors = self.total();
            self.add(TermKind::CudaContext, CUDA_CONTEXT_BYTES);
            self.add(
                TermKind::NcclBuffers,
                communicators * NCCL_COMMUNICATOR_BYTES,
            );
            self.add(
                TermKind::AllocatorMargin,
                (tensors as f64 * ALLOCATOR_MARGIN).ceil() as u64,
            );
        }
    }
}

/// Element sizes of a precision: (master weights and AdamW moments, compute).
pub fn precision_bytes(p: Precision) -> (u64, u64) {
    match p {
        Precision::Full32 => (4, 4),
        Precision::Bf16Mixed | Precision::Fp16Mixed => (4, 2),
        Precision::Bf16True => (2, 2),
        // callers pass the resolved precision (`JobConfig::precision`); unresolved, a CPU's
        Precision::Auto => precision_bytes(Precision::Full32),
    }
}

fn dtype_bytes(d: Dtype) -> u64 {
    match d {
        Dtype::Float32 => 4,
        Dtype::Bfloat16 | Dtype::Float16 => 2,
    }
}

/// FSDP's flat groups for a shard group of `shard` ranks (`fsdp_layout.rs`: `wrap_units`,
/// `layouts`): the units of each group, its elements, and its padded size. `numel`,
/// `padded` and `shard` are the trained group's; a LoRA job's ranges also have a frozen group
/// (`frozen_padded`, `frozen_shard`: sharded and gathered in the param dtype, no gradient, no
/// moments), zero otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatGroup {
    pub units: Range<usize>,
    pub numel: u64,
    pub padded: u64,
    pub shard: u64,
    pub frozen_padded: u64,
    pub frozen_shard: u64,
}

pub fn flat_groups(units: &Units, f: &FsdpConfig, shard: u64) -> Vec<FlatGroup> {
    let ranges = f.auto_wrap_policy.groups(&units.owned, f.min_num_params);
    ranges
        .into_iter()
        .map(|r| {
            let numel: u64 = units.trained[r.clone()].iter().sum();
            let frozen = units.owned[r.clone()].iter().sum::<u64>() - numel;
            let per = numel.div_ceil(shard);
            let frozen_per = frozen.div_ceil(shard);
            FlatGroup {
                units: r,
                numel,
                padded: per * shard,
                shard: per,
                frozen_padded: frozen_per * shard,
                frozen_shard: frozen_per,
            }
        })
        .collect()
}

/// How one rank holds its weights.
enum Weights {
    /// One process or DDP: a full replica; DDP on more than one rank keeps its gradients in
    /// `buckets`.
    Replicated {
        copies: bool,
        buckets: Option<DdpBuckets>,
    },
    Fsdp(FsdpShape),
}

/// DDP's gradient buckets ([`DdpConfig::buckets`], as `replicated.rs` `GradReducer::new` lays
/// them out). The gradients are views of the buckets, and a bucket is allocated when the
/// first gradient of the step lands in it.
struct DdpBuckets {
    /// Each unit's bucket.
    of_unit: Vec<usize>,
    /// Each bucket's elements and the highest unit it holds (whose backward allocates it).
    buckets: Vec<(u64, usize)>,
}

impl DdpBuckets {
    fn new(trained: &[u64], ddp: &DdpConfig) -> Self {
        let ranges = ddp.buckets(trained);
        let mut of_unit = vec![ranges.len(); trained.len()];
        let mut buckets = vec![];
        for (i, r) in ranges.iter().enumerate() {
            for u in r.clone() {
                of_unit[u] = i;
            }
            buckets.push((trained[r.clone()].iter().sum(), r.end - 1));
        }
        Self { of_unit, buckets }
    }

    /// Gradient elements allocated when unit `u`'s gradients land: every bucket holding a unit
    /// at or above `u`, and, with a tied embedding (whose gradient the head's backward starts),
    /// the embedding's bucket.
    fn allocated_at(&self, u: usize, tied: bool) -> u64 {
        let embedding = self.of_unit.first().copied();
        self.buckets
            .iter()
            .enumerate()
            .filter(|(i, (_, top))| *top >= u || (tied && Some(*i) == embedding))
            .map(|(_, (elements, _))| elements)
            .sum()
    }
}

struct FsdpShape {
    groups: Vec<FlatGroup>,
    /// Group of each unit.
    unit_group: Vec<usize>,
    /// Ranks of the shard group.
    shard_world: u64,
    /// Bytes of the param (gathered) and reduce dtypes.
    p: u64,
    r: u64,
    frees_after_use: bool,
    forward_prefetch: bool,
    backward_prefetch: bool,
    offload: bool,
    /// Whether a gathered group is a tensor of its own (the shard group's buffer, or a cast or
    /// device copy of a one-rank shard) rather than the shard itself.
    gather_copies: bool,
    full_checkpoints: bool,
    /// `sync_module_states` over more than one rank: rank 0 broadcasts each group at start-up.
    sync: bool,
}

impl FsdpShape {
    fn new(job: &JobConfig, f: &FsdpConfig, units: &Units, c: u64, m: u64, gpu: bool) -> Self {
        let world = job.compute.world_size() as u64;
        let shard_world = if world <= 1 {
            1
        } else {
            match f.sharding_strategy {
                ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => world,
                ShardingStrategy::NoShard => 1,
                ShardingStrategy::HybridShard => job.compute.tasks_per_node.max(1) as u64,
            }
        };
        let groups = flat_groups(units, f, shard_world);
        let mut unit_group = vec![0; units.count()];
        for (g, group) in groups.iter().enumerate() {
            for u in group.units.clone() {
                unit_group[u] = g;
            }
        }
        let p = f.param_dtype.map_or(c, dtype_bytes);
        let offload = f.cpu_offload && gpu;
        Self {
            groups,
            unit_group,
            shard_world,
            p,
            r: f.reduce_dtype.map_or(c, dtype_bytes),
            frees_after_use: shard_world > 1
                && matches!(
                    f.sharding_strategy,
                    ShardingStrategy::FullShard | ShardingStrategy::HybridShard
                ),
            forward_prefetch: f.forward_prefetch,
            backward_prefetch: f.backward_prefetch.is_some(),
            offload,
            gather_copies: shard_world > 1 || p != m || offload,
            full_checkpoints: f.state_dict_type == StateDictType::Full,
            sync: f.sync_module_states && world > 1,
        }
    }

    fn sum(&self, f: impl Fn(&FlatGroup) -> u64) -> u64 {
        self.groups.iter().map(f).sum()
    }

    /// Bytes of a range's groups gathered: the trained group's a tensor of its own when
    /// `gather_copies`; a frozen group's, held in the param dtype already, when it comes
    /// from other ranks or the host.
    fn gathered_bytes(&self, g: &FlatGroup) -> u64 {
        let trained = if self.gather_copies { g.padded } else { 0 };
        let frozen = if self.gathers_copy() {
            g.frozen_padded
        } else {
            0
        };
        (trained + frozen) * self.p
    }

    /// Bytes of this rank's parameter shards: trained in the master dtype, frozen in the
    /// param dtype.
    fn shard_bytes(&self, m: u64) -> u64 {
        self.sum(|g| g.shard * m + g.frozen_shard * self.p)
    }

    /// Bytes of unsharded gradients alive when unit `u` hands its gradients over
    /// (`Fsdp::gradients_ready`): its group's, assembled, and the next group's, whose
    /// reduce-scatter is still in flight (the next one starts only when it lands).
    fn unsharded_at(&self, u: usize) -> u64 {
        let flat = |g: usize| self.groups.get(g).map_or(0, |g| g.padded * self.r);
        let own = self.unit_group[u];
        flat(own) + flat(own + 1)
    }

    fn max(&self, f: impl Fn(&FlatGroup) -> u64) -> u64 {
        self.groups.iter().map(f).max().unwrap_or(0)
    }

    /// Whether gathering a group makes a tensor of its own (more than one shard rank, or
    /// shards offloaded to the host).
    fn gathers_copy(&self) -> bool {
        self.shard_world > 1 || self.offload
    }

    /// Groups unit `u` reads: its own, and the embedding's for a tied head.
    fn reads(&self, u: usize, n: usize, tied: bool) -> Vec<usize> {
        let mut g = vec![self.unit_group[u]];
        if tied && u + 1 == n && !g.contains(&self.unit_group[0]) {
            g.push(self.unit_group[0]);
        }
        g
    }

    /// Bytes of gathered groups held while each unit computes, in forward and in backward
    /// (`Fsdp::materialize` and `release` replayed).
    fn gathered_timeline(&self, n: usize, tied: bool) -> (Vec<u64>, Vec<u64>) {
        let bytes = |g: usize| self.gathered_bytes(&self.groups[g]);
        let mut held = vec![false; self.groups.len()];
        let total = |held: &[bool]| -> u64 {
            held.iter()
                .enumerate()
                .filter(|(_, h)| **h)
                .map(|(g, _)| bytes(g))
                .sum()
        };
        let mut forward = vec![0; n];
        let mut backward = vec![0; n];
        let release = |held: &mut Vec<bool>, u: usize, backward: bool| {
            if !self.frees_after_use {
                return;
            }
            let own = self.unit_group[u];
            let units = &self.groups[own].units;
            let done = if backward {
                u == units.start
            } else {
                u + 1 == units.end
            };
            for g in self.reads(u, n, tied) {
                if g != own || done {
                    held[g] = false;
                }
            }
        };
        for (u, slot) in forward.iter_mut().enumerate() {
            let mut peak = 0;
            for g in self.reads(u, n, tied) {
                held[g] = true;
                peak = peak.max(total(&held));
            }
            let own = self.unit_group[u];
            if self.forward_prefetch && own + 1 < self.groups.len() {
                held[own + 1] = true;
                peak = peak.max(total(&held));
            }
            *slot = peak;
            if u + 1 < n {
                release(&mut held, u, false);
            }
        }
        for u in (0..n).rev() {
            let mut peak = total(&held);
            for g in self.reads(u, n, tied) {
                held[g] = true;
                peak = peak.max(total(&held));
            }
            let own = self.unit_group[u];
            if self.backward_prefetch && own > 0 {
                held[own - 1] = true;
                peak = peak.max(total(&held));
            }
            backward[u] = peak;
            release(&mut held, u, true);
        }
        (forward, backward)
    }
}

/// The numbers of one job's step on one rank.
pub struct Step<'a> {
    job: &'a JobConfig,
    pub units: Units,
    pub act: Activations,
    weights: Weights,
    /// Master and compute element bytes.
    pub m: u64,
    pub c: u64,
    pub accum: u64,
    pub checkpointing: bool,
    pub gpu: bool,
}

impl<'a> Step<'a> {
    pub fn new(job: &'a JobConfig) -> Self {
        let t = &job.trainer;
        let gpu = job.runs_on_gpu();
        let units = Units::of(job);
        let (m, c) = precision_bytes(job.precision());
        let world = job.compute.world_size();
        let (weights, a, checkpointing) = match &t.dist {
            DistConfig::None | DistConfig::Ddp(_) => (
                Weights::Replicated {
                    copies: c != m,
                    buckets: match &t.dist {
                        DistConfig::Ddp(d) if world > 1 => Some(DdpBuckets::new(&units.trained, d)),
                        _ => None,
                    },
                },
                c,
                t.activation_checkpointing,
            ),
            DistConfig::Fsdp(f) => {
                let shape = FsdpShape::new(job, f, &units, c, m, gpu);
                let p = shape.p;
                (
                    Weights::Fsdp(shape),
                    p,
                    t.activation_checkpointing || f.activation_checkpointing,
                )
            }
        };
        let block_params = units.trained.get(1).copied().unwrap_or(0);
        // A micro-batch of preference pairs is twice as many sequences: each pair's chosen
        // and rejected ones.
        let sequences = if job.objective.dpo().is_some() { 2 } else { 1 };
        let act = Activations::of(job, sequences * t.micro_batch_size as u64, a, block_params);
        Self {
            job,
            accum: t.grad_accum_steps(world) as u64,
            units,
            act,
            weights,
            m,
            c,
            checkpointing,
            gpu,
        }
    }

    fn n(&self) -> usize {
        self.units.count()
    }

    fn tied(&self) -> bool {
        self.job.model.tie_word_embeddings
    }

    /// FSDP: the most bytes of unsharded gradients alive at once over the backward pass (at
    /// some unit's hand-off; the moments keep only the worst block's). `None` without FSDP.
    pub fn peak_unsharded_grads(&self) -> Option<u64> {
        match &self.weights {
            Weights::Fsdp(f) => (0..self.n()).map(|u| f.unsharded_at(u)).max(),
            Weights::Replicated { .. } => None,
        }
    }

    /// FSDP: the most bytes of gathered groups alive at once over the forward and backward
    /// passes (the moments keep only the worst block's, which in a model of unequal blocks, a
    /// mixture with dense layers, need not be the one that gathers most). `None` without FSDP.
    pub fn peak_gathered(&self) -> Option<u64> {
        match &self.weights {
            Weights::Fsdp(f) => {
                let (forward, backward) = f.gathered_timeline(self.n(), self.tied());
                forward.into_iter().chain(backward).max()
            }
            Weights::Replicated { .. } => None,
        }
    }

    /// Activations held between a unit's forward and backward.
    fn kept(&self, u: usize) -> u64 {
        let a = &self.act;
        let n = self.n();
        if u == 0 {
            a.tokens
        } else if u + 1 == n {
            a.head
        } else if self.checkpointing {
            a.block_input
        } else {
            a.block()
        }
    }

    fn has_eval(&self) -> bool {
        self.job.trainer.eval_every > 0
            && match &self.job.data {
                DataConfig::Arithmetic(d) => d.num_eval > 0,
                DataConfig::Tokens(d) => d.eval_path.is_some(),
                DataConfig::Text(d) => {
                    d.eval_paths.is_some() || d.eval_fraction.is_some() || d.eval_records.is_some()
                }
                DataConfig::Jsonl(d) => d.has_eval(),
                DataConfig::Chat(d) => d.has_eval(),
                DataConfig::Preference(d) => d.has_eval(),
            }
    }

    /// Every moment of the step that can be its peak, with each term's bytes then.
    pub fn moments(&self) -> Vec<Moment> {
        let n = self.n();
        let (m, big) = (self.m, self.units.total());
        let act = self.act;
        let kept_upto = |u: usize| -> u64 { (0..=u).map(|v| self.kept(v)).sum() };
        let kept_all = kept_upto(n - 1) + act.shared();
        let recompute = if self.checkpointing {
            act.block_saved
        } else {
            0
        };
        // Replicated weights: the trained parameters (all, but for LoRA's frozen base, held
        // in the compute dtype, without gradients or moments).
        let trained = |u: usize| self.units.trained[u];
        let trained_after = |u: usize| -> u64 { (u + 1..n).map(trained).sum() };
        let all_trained = self.units.trained_total();
        let replica = all_trained * m + (big - all_trained) * self.c;
        let mut out = vec![];

        // States present all step long, and the phases' own terms.
        let keeps_reference = self.job.keeps_reference_copy();
        let base = |phase: Phase| -> Moment {
            let mut mo = Moment::new(phase);
            match &self.weights {
                Weights::Replicated { .. } => {
                    mo.add(TermKind::Params, replica);
                    mo.add(TermKind::Optimizer, 2 * all_trained * m);
                    if keeps_reference {
                        mo.add(TermKind::Reference, all_trained * self.c);
                    }
                }
                Weights::Fsdp(f) if !f.offload => {
                    let shards = f.sum(|g| g.shard);
                    mo.add(TermKind::Params, f.shard_bytes(m));
                    mo.add(TermKind::Optimizer, 2 * shards * m);
                    if keeps_reference {
                        mo.add(TermKind::Reference, shards * f.p);
                    }
                }
                Weights::Fsdp(_) => {}
            }
            mo
        };

        match &self.weights {
            Weights::Replicated { copies, buckets } => {
                // Casts of the trained parameters a unit reads (a frozen base is already in
                // the compute dtype).
                let copy = |u: usize| {
                    if !*copies {
                        0
                    } else if all_trained == big {
                        self.units.reads[u] * self.c
                    } else {
                        trained(u) * self.c
                    }
                };
                let tied_embed = if self.tied() { trained(0) } else { 0 };
                // Loss backward: no gradient yet unless accumulating.
                let mut mo = base(Phase::LossBackward);
                let copies_at_loss: u64 = if self.checkpointing {
                    copy(n - 1)
                } else {
                    (0..n).map(copy).sum()
                };
                mo.add(TermKind::ComputeCopies, copies_at_loss);
                if self.accum > 1 {
                    mo.add(TermKind::Grads, all_trained * 4);
                }
                mo.add(TermKind::Activations, kept_all);
                mo.add(TermKind::Logits, act.logits);
                mo.add(TermKind::Loss, act.loss);
                mo.add(TermKind::LossBackward, act.loss_backward);
                out.push(mo);
                // Each block's backward (the engine runs blocks n-2 .. 1).
                let mut worst: Option<Moment> = None;
                for u in (1..n - 1).rev() {
                    let mut mo = base(Phase::Backward);
                    mo.add(
                        TermKind::ComputeCopies,
                        if self.checkpointing {
                            copy(u)
                        } else {
                            (0..=u).map(copy).sum()
                        },
                    );
                    let grads = match buckets {
                        _ if self.accum > 1 => all_trained,
                        Some(b) => b.allocated_at(u, self.tied()),
                        None => trained_after(u) + trained(u) + tied_embed,
                    };
                    mo.add(TermKind::Grads, grads * 4);
                    mo.add(TermKind::Activations, kept_upto(u) + act.shared());
                    mo.add(TermKind::Recompute, recompute);
                    // In fp32 the block's weight gradients are copied into their buckets.
                    let copied = match buckets {
                        Some(_) if self.c == 4 => trained(u) * 4,
                        _ => 0,
                    };
                    mo.add(TermKind::BackwardWorkspace, act.block_backward + copied);
                    if worst.as_ref().is_none_or(|w| mo.total() > w.total()) {
                        worst = Some(mo);
                    }
                }
                out.extend(worst);
                let mut mo = base(Phase::EndOfBackward);
                mo.add(TermKind::Grads, all_trained * 4);
                out.push(mo);
                let mut mo = base(Phase::OptimizerStep);
                mo.add(TermKind::Grads, all_trained * 4);
                // Three temporaries of the largest trained tensor, and its gradient cast to a
                // bf16 master.
                let largest = self.units.largest_trained;
                let cast = if m == 4 { 0 } else { largest * m };
                mo.add(TermKind::OptimizerWorkspace, 3 * largest * m + cast);
                out.push(mo);
            }
            Weights::Fsdp(f) => {
                let (fwd_gathered, bwd_gathered) = f.gathered_timeline(n, self.tied());
                let tied_embed = if self.tied() { trained(0) } else { 0 };
                let shards = f.sum(|g| g.shard);
                // Under gradient accumulation the sharded gradients exist from the first
                // micro-batch's reduction on.
                let accumulated = if self.accum > 1 && !f.offload {
                    shards * m
                } else {
                    0
                };
                let unsharded_at = |u: usize| f.unsharded_at(u);
                let mut mo = base(Phase::LossBackward);
                mo.add(
                    TermKind::Gathered,
                    bwd_gathered[n - 1].max(fwd_gathered[n - 1]),
                );
                mo.add(TermKind::Grads, accumulated);
                mo.add(TermKind::Activations, kept_all);
                mo.add(TermKind::Logits, act.logits);
                mo.add(TermKind::Loss, act.loss);
                mo.add(TermKind::LossBackward, act.loss_backward);
                out.push(mo);
                let mut worst: Option<Moment> = None;
                for u in (1..n - 1).rev() {
                    let mut mo = base(Phase::Backward);
                    mo.add(TermKind::Gathered, bwd_gathered[u]);
                    mo.add(TermKind::Grads, accumulated);
                    // A block's gradients as computed, in the param dtype (FSDP takes them
                    // over as they are); the tied embedding's, summed over its two readers,
                    // in fp32.
                    mo.add(
                        TermKind::GradAccumulators,
                        trained(u) * f.p + tied_embed * 4,
                    );
                    mo.add(TermKind::UnshardedGrads, unsharded_at(u));
                    mo.add(TermKind::Activations, kept_upto(u) + act.shared());
                    mo.add(TermKind::Recompute, recompute);
                    mo.add(TermKind::BackwardWorkspace, act.block_backward);
                    if worst.as_ref().is_none_or(|w| mo.total() > w.total()) {
                        worst = Some(mo);
                    }
                }
                out.extend(worst);
                // Gathered groups SHARD_GRAD_OP (and a group of one rank that casts) keeps
                // until the step ends.
                let kept_gathered = if f.frees_after_use {
                    0
                } else {
                    f.sum(|g| f.gathered_bytes(g))
                };
                // The embedding's backward done: its fp32 gradients copied into group 0's
                // unsharded gradient while group 1's reduction is still in flight, the other
                // sharded gradients in place.
                let mut mo = base(Phase::EndOfBackward);
                mo.add(TermKind::Gathered, kept_gathered);
                if !f.offload {
                    mo.add(TermKind::Grads, shards * m);
                }
                let embed_bytes = if self.tied() { 4 } else { f.p };
                mo.add(TermKind::GradAccumulators, trained(0) * embed_bytes);
                mo.add(TermKind::UnshardedGrads, unsharded_at(0));
                out.push(mo);
                let mut mo = base(Phase::OptimizerStep);
                mo.add(TermKind::Gathered, kept_gathered);
                if !f.offload {
                    mo.add(TermKind::Grads, shards * m);
                    let shard = f.max(|g| g.shard);
                    mo.add(TermKind::OptimizerWorkspace, 3 * shard * m);
                }
                out.push(mo);
            }
        }

        // Evaluation, in the compute dtype without gradients: replicated weights run a
        // micro-batch at a time, each unit's weights cast as it runs; FSDP gathers the groups
        // one unit reads, cast to the param dtype before the all-gather, and walks the units
        // once for all of the rank's evaluation micro-batches.
        if self.has_eval() {
            let mut mo = base(Phase::Evaluation);
            let t = &self.job.trainer;
            let micro = t.micro_batch_size as u64;
            let a = Activations::of(self.job, micro, self.c, 0);
            match &self.weights {
                Weights::Fsdp(f) => {
                    if f.gathers_copy() {
                        let reads = (0..n)
                            .map(|u| {
                                f.reads(u, n, self.tied())
                                    .iter()
                                    .map(|&g| {
                                        let g = &f.groups[g];
                                        (g.padded + g.frozen_padded) * f.p
                                    })
                                    .sum::<u64>()
                            })
                            .max()
                            .unwrap_or(0);
                        mo.add(TermKind::EvalGather, reads);
                    }
                    let world = self.job.compute.world_size().max(1) as u64;
                    let rows = (t.eval_batches as u64 * micro).div_ceil(world);
                    let hidden = rows
                        * self.job.data.seq_len() as u64
                        * self.job.model.hidden_size as u64
                        * self.c;
                    mo.add(TermKind::EvalForward, 2 * hidden + a.eval_loss);
                }
                Weights::Replicated { .. } => {
                    mo.add(TermKind::EvalForward, a.eval_loss + a.block_input);
                }
            }
            out.push(mo);
        }
        // A checkpoint (there is always the final model): FSDP gathers a group at a time to
        // rank 0 for full checkpoints and for the final model.
        if let Weights::Fsdp(f) = &self.weights {
            if f.gathers_copy() {
                let mut mo = base(Phase::Checkpoint);
                mo.add(TermKind::CheckpointGather, f.max(|g| g.padded) * m);
                out.push(mo);
            }
        }
        // Start-up: each rank builds its replica or its shards (and zero moments) from the
        // source; with `sync_module_states` every rank holds one group whole while it is
        // broadcast.
        let mut mo = Moment::new(Phase::Startup);
        match &self.weights {
            Weights::Replicated { .. } => {
                mo.add(TermKind::Params, replica);
            }
            Weights::Fsdp(f) => {
                if f.sync {
                    let group = f.max(|g| (g.padded * m).max(g.frozen_padded * f.p));
                    mo.add(TermKind::StartupParams, group);
                }
                if !f.offload {
                    let shards = f.sum(|g| g.shard);
                    mo.add(TermKind::Params, f.shard_bytes(m));
                    mo.add(TermKind::Optimizer, 2 * shards * m);
                }
            }
        }
        out.push(mo);
        let communicators = self.communicators();
        for mo in &mut out {
            mo.finish(self.gpu, communicators);
        }
        out
    }

    /// NCCL communicators of two or more ranks each rank holds: the world's, and under
    /// HYBRID_SHARD a node's and a cross-node one (those of more than one rank).
    fn communicators(&self) -> u64 {
        let c = &self.job.compute;
        let world = c.world_size() as u64;
        if world <= 1 {
            return 0;
        }
        match &self.job.trainer.dist {
            DistConfig::Fsdp(f) if f.sharding_strategy == ShardingStrategy::HybridShard => {
                let per_node = c.tasks_per_node.max(1) as u64;
                let nodes = world / per_node;
                1 + u64::from(per_node > 1) + u64::from(nodes > 1)
            }
            _ => 1,
        }
    }

    /// Host memory of one node: `(term, bytes)` for each host term, and the peak (the
    /// process, data and offloaded states, plus the larger of writing and reading a
    /// checkpoint).
    pub fn host(&self, device_peak: u64) -> (Vec<(TermKind, u64)>, u64) {
        let ranks = self.job.compute.tasks_per_node.max(1) as u64;
        let m = self.m;
        let mut terms = vec![];
        let per_process = if self.gpu {
            PROCESS_HOST_BYTES_GPU
        } else {
            // A CPU rank's tensors are host memory too.
            PROCESS_HOST_BYTES_CPU + device_peak
        };
        terms.push((TermKind::Process, ranks * per_process));
        let data = match &self.job.data {
            DataConfig::Arithmetic(d) => ((d.num_train + d.num_eval) * d.seq_len * 4) as u64,
            _ => 0,
        };
        // Input ids and labels of one step's micro-batches.
        let batches = 2 * self.accum * self.act.tokens;
        terms.push((TermKind::Data, ranks * (data + batches)));
        // The most elements of one trained parameter a rank reads at a time on resume (FSDP: a
        // piece within its shard); checkpoints hold only trained parameters.
        let largest = self.units.largest_trained;
        // Rank 0 streams a full checkpoint (and the final model) a chunk at a time: the chunk
        // on the host, its cast to the file's dtype (fp32 for the final model) and its bytes.
        let streamed = WRITE_CHUNK_ELEMENTS.min(largest) * (m + 8);
        let (offloaded, write, piece) = match &self.weights {
            Weights::Fsdp(f) => {
                let shards = f.sum(|g| g.shard);
                let offloaded = if f.offload {
                    ranks
                        * (4 * shards * m
                            + 3 * f.max(|g| g.shard) * m
                            + f.sum(|g| g.frozen_shard) * f.p)
                } else {
                    0
                };
                // Sharded checkpoints: every rank writes its shards and moments through
                // libtorch, which copies them to the host.
                let write = if f.full_checkpoints {
                    streamed
                } else {
                    streamed.max(ranks * 3 * shards * m)
                };
                (offloaded, write, largest.min(f.max(|g| g.shard)))
            }
            Weights::Replicated { .. } => (0, streamed, largest),
        };
        terms.push((TermKind::Offloaded, offloaded));
        self.host_finish(terms, write, ranks * piece * m)
    }

    /// Adds the checkpoint-write and resume terms (resume only when the job may resume) and
    /// sums the peak: the fixed terms plus the larger of writing and reading.
    fn host_finish(
        &self,
        mut terms: Vec<(TermKind, u64)>,
        write: u64,
        resume: u64,
    ) -> (Vec<(TermKind, u64)>, u64) {
        terms.push((TermKind::CheckpointWrite, write));
        let resume = if self.job.trainer.resume == Resume::Never {
            0
        } else {
            resume
        };
        terms.push((TermKind::ResumeRead, resume));
        let fixed: u64 = terms
            .iter()
            .filter(|(k, _)| matches!(k, TermKind::Process | TermKind::Data | TermKind::Offloaded))
            .map(|(_, b)| b)
            .sum();
        let peak = fixed + write.max(resume);
        (terms, peak)
    }
}
