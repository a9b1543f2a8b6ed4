//! The interface between the training loop (and checkpoints) and however the parameters are
//! laid out across ranks: [`ParallelWeights`] is what one optimizer step and a checkpoint need
//! of the weights, whether they are replicated (one process, DDP; `replicated.rs`) or sharded
//! (FSDP; `fsdp.rs`). `parallelize.rs` picks the implementation; nothing else asks which it
//! is. This file also owns the [`MemoryReport`], the [`HeldTensors`] and the
//! [`CheckpointState`] the implementations hand back.

use tch::Tensor;

use super::engine::Engine;
use super::fsdp_layout::GroupLayout;
use super::TrainError;
use crate::data::StepBatches;
use crate::model::Params;

/// Bytes a rank holds for training state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    pub params: usize,
    pub grads: usize,
    pub optimizer: usize,
}

impl MemoryReport {
    pub fn total(&self) -> usize {
        self.params + self.grads + self.optimizer
    }
}

/// The tensors a rank holds for training state now, by what they are (shallow handles): what
/// memory accounting counts, storage by storage (`storage_shim::distinct_storage_bytes`).
#[derive(Debug, Default)]
pub struct HeldTensors {
    /// Master parameters (FSDP: this rank's shards).
    pub params: Vec<Tensor>,
    /// This step's gradients as the optimizer will take them (empty between steps).
    pub grads: Vec<Tensor>,
    /// AdamW moments (empty before the first step of replicated weights).
    pub optimizer: Vec<Tensor>,
}

/// Bytes of a tensor's elements.
pub(crate) fn nbytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// What a checkpoint of the weights holds, as the weights give it; `checkpoint.rs` decides the
/// files.
pub enum CheckpointState {
    /// Full tensors in the single-process format (gathered when sharded); rank 0 writes them.
    Full {
        params: Params,
        /// AdamW state: `step`, `{name}.exp_avg`, `{name}.exp_avg_sq`.
        optimizer: Vec<(String, Tensor)>,
    },
    /// This rank's shard of the flat groups (FSDP, `state_dict_type: sharded`).
    Sharded(ShardState),
}

/// One rank's part of a sharded checkpoint.
pub struct ShardState {
    /// This rank's place in the shard group.
    pub shard_rank: usize,
    pub shard_world: usize,
    /// Whether this rank writes its shard (the first replica of it does).
    pub writes_shard: bool,
    /// `group{g}.param|exp_avg|exp_avg_sq`.
    pub tensors: Vec<(String, Tensor)>,
    pub optimizer_step: u64,
    pub layouts: Vec<GroupLayout>,
}

/// The parameters of one rank, with their optimizer, however they are distributed. One
/// optimizer step calls, in order: [`forward_backward`](Self::forward_backward),
/// [`unscale_grads`](Self::unscale_grads) (fp16 loss scaling only),
/// [`clip_grad_norm`](Self::clip_grad_norm), [`optimizer_step`](Self::optimizer_step) or
/// [`discard_grads`](Self::discard_grads), then [`end_step`](Self::end_step). Calls that say
/// "collective" must be made by every rank in the same order.
pub trait ParallelWeights {
    /// Forward and backward of one step's micro-batches through `engine` (collective: the
    /// gradient reduction); returns this rank's loss. The reduced gradients stay with the
    /// weights for the rest of the step.
    fn forward_backward(
        &mut self,
        engine: &Engine<'_>,
        batches: &StepBatches,
    ) -> Result<f64, TrainError>;

    /// Multiplies this step's gradients by `inv_scale` in place; returns whether any gradient
    /// element is inf or NaN on any rank (the same answer on every rank; may be collective).
    fn unscale_grads(&mut self, inv_scale: f64) -> Result<bool, TrainError>;

    /// The global L2 norm of this step's gradients before clipping, after clipping them to
    /// `max_norm` when it is positive (may be collective).
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64, TrainError>;

    /// One AdamW step at learning rate `lr` with this step's gradients.
    fn optimizer_step(&mut self, lr: f64) -> Result<(), TrainError>;

    /// Drops this step's gradients without updating (a skipped step).
    fn discard_grads(&mut self);

    /// Releases what the step held (gathered parameters, gradients).
    fn end_step(&mut self) -> Result<(), TrainError>;

    /// The full parameters in the master dtype (collective when sharded).
    fn full_params(&self) -> Result<Params, TrainError>;

    /// Bytes this rank holds for parameters, gradients and optimizer state.
    fn memory(&self) -> MemoryReport;

    /// The most bytes of gathered (unsharded) parameters held at once so far, for weights that
    /// gather.
    fn peak_gathered_bytes(&self) -> Option<usize>;

    /// The tensors held now for parameters, gradients and optimizer state.
    fn held_tensors(&self) -> HeldTensors;

    /// The most bytes of DDP gradient buckets in flight at once so far, for weights that
    /// all-reduce gradients in buckets.
    fn peak_bucket_bytes(&self) -> Option<usize> {
        None
    }

    /// What a checkpoint of these weights holds (collective: full checkpoints of sharded
    /// weights gather).
    fn checkpoint_state(&self) -> Result<CheckpointState, TrainError>;

    /// Replaces the parameters and optimizer state from full tensors in the single-process
    /// format (any world size and strategy wrote them). Not collective.
    fn load_full_state(
        &mut self,
        params: &Params,
        optimizer: Vec<(String, Tensor)>,
    ) -> Result<(), TrainError>;
}
