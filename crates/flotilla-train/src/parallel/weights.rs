//! The interface between the training loop (and checkpoints) and however the parameters are
//! laid out across ranks: [`ParallelWeights`] is what one optimizer step and a checkpoint need
//! of the weights, whether they are replicated (one process, DDP; `replicated.rs`) or sharded
//! (FSDP; `fsdp.rs`). `parallelize.rs` picks the implementation; nothing else asks which it
//! is. This file also owns the [`MemoryReport`], the [`HeldTensors`], the parts of a full
//! checkpoint ([`StatePart`]) and the sharded state ([`ShardState`]) the implementations
//! hand back.

use tch::{Kind, Tensor};

use crate::data::StepBatches;
use crate::error::TrainError;
use crate::model::{CausalLm, Params, TokenInput};
use crate::parallel::engine::Engine;
use crate::parallel::layout::GroupLayout;
use crate::state::param_source::TensorSource;

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
    /// Preference tuning's frozen reference copy (empty when none is kept).
    pub reference: Vec<Tensor>,
}

/// The most bytes of transient tensors sharded weights held at once so far, at the moments
/// the memory planner models (zero for weights that hold none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransientPeaks {
    /// Unsharded gradients: the group whose reduce-scatter is in flight and the one being
    /// assembled.
    pub unsharded_grads: usize,
    /// Groups gathered in the master dtype to evaluate.
    pub eval_gathered: usize,
    /// A group gathered to rank 0 for a full checkpoint or the final model (rank 0's figure;
    /// a shard's worth of scratch elsewhere).
    pub checkpoint_gathered: usize,
}

/// Bytes of a tensor's elements.
pub(crate) fn nbytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// A part of the training state that a full checkpoint stores tensor by tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatePart {
    /// The trained parameters in the master dtype.
    Params,
    /// Every parameter of the model, a LoRA job's frozen base included (each in the dtype it
    /// is held in): what merging the adapters into the base reads.
    Model,
    /// AdamW's first moment of each parameter.
    ExpAvg,
    /// AdamW's second moment of each parameter.
    ExpAvgSq,
}

impl StatePart {
    /// The suffix of the part's tensors in `optimizer.safetensors` (`""` for parameters).
    pub fn suffix(self) -> &'static str {
        match self {
            StatePart::Params | StatePart::Model => "",
            StatePart::ExpAvg => ".exp_avg",
            StatePart::ExpAvgSq => ".exp_avg_sq",
        }
    }
}

/// Receives the full tensors of a [`StatePart`] one at a time: `(parameter name, tensor)`.
pub type FullStateVisitor<'a> = &'a mut dyn FnMut(&str, &Tensor) -> Result<(), TrainError>;

/// Where resumed AdamW state comes from.
pub struct OptimizerSource<'a> {
    pub exp_avg: &'a dyn TensorSource,
    pub exp_avg_sq: &'a dyn TensorSource,
    /// Optimizer steps taken.
    pub step: u64,
    /// Parameters that have moments (replicated weights create them at their first update).
    pub with_moments: Vec<String>,
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
/// [`clip_grad_norm`](Self::clip_grad_norm), [`optimizer_step`](Self::optimizer_step), then
/// [`end_step`](Self::end_step); and [`forget_step`](Self::forget_step) once fp16's flag is read
/// set. Calls that say "collective" must be made by every rank in the same order.
pub trait ParallelWeights {
    /// Forward and backward of one step's micro-batches through `engine` (collective: the
    /// gradient reduction); returns this rank's loss, a scalar on the device (not read). The
    /// reduced gradients stay with the weights for the rest of the step.
    fn forward_backward(
        &mut self,
        engine: &Engine<'_>,
        batches: &StepBatches,
    ) -> Result<Tensor, TrainError>;

    /// Multiplies this step's gradients by `inv_scale` in place; returns whether any gradient
    /// element is inf or NaN on any rank as a flag on the device (1 or 0, the same on every
    /// rank; may be collective), not read.
    fn unscale_grads(&mut self, inv_scale: f64) -> Result<Tensor, TrainError>;

    /// The global L2 norm of this step's gradients before clipping (a scalar on the device,
    /// not read), after clipping them to `max_norm` when it is positive (may be collective).
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<Tensor, TrainError>;

    /// One AdamW step at learning rate `lr` with this step's gradients; where `found_inf` (the
    /// flag of [`unscale_grads`](Self::unscale_grads)) holds 1 it changes nothing, decided on
    /// the device.
    fn optimizer_step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), TrainError>;

    /// Takes back the optimizer's count of the last step, which its found-inf flag skipped.
    fn forget_step(&mut self);

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

    /// The most bytes of the transient tensors of sharded weights held at once so far.
    fn transient_peaks(&self) -> TransientPeaks {
        TransientPeaks::default()
    }

    /// This rank's shards for a sharded checkpoint (FSDP with `state_dict_type: sharded`);
    /// `None` for weights whose checkpoints are full.
    fn sharded_state(&self) -> Option<ShardState> {
        None
    }

    /// The full tensors of `part` in the order [`ParallelWeights::visit_full`] gives them:
    /// `(name, shape, dtype)`. Not collective.
    fn full_layout(&self, part: StatePart) -> Vec<(String, Vec<i64>, Kind)>;

    /// Gives `visit` each full tensor of `part`, in [`ParallelWeights::full_layout`] order,
    /// one at a time (collective when sharded: a group is gathered to rank 0 at a time, and
    /// only rank 0 may pass a visitor; the tensors are valid during the call only).
    fn visit_full(
        &self,
        part: StatePart,
        visit: Option<FullStateVisitor<'_>>,
    ) -> Result<(), TrainError>;

    /// Optimizer steps taken.
    fn optimizer_steps(&self) -> u64;

    /// Replaces the parameters (and the optimizer state, when given) from sources in the
    /// single-process naming, whatever world size and strategy wrote them: each rank reads
    /// only what it holds. Not collective.
    fn load_state(
        &mut self,
        params: &dyn TensorSource,
        optimizer: Option<OptimizerSource<'_>>,
    ) -> Result<(), TrainError>;

    /// Keeps a frozen copy of the current trained parameters as the reference model of
    /// preference tuning, held as the parameters are (replicated, or sharded like them), in
    /// the dtype the units compute in. A LoRA job copies its adapters only `with_adapters`
    /// (retraining an adapter it started from, as TRL keeps a "ref" adapter; the base is
    /// shared); otherwise it keeps nothing, its reference being the base with the adapters
    /// off. Call it before any step (and before a checkpoint is restored): the reference is
    /// the starting weights.
    fn keep_reference(&mut self, with_adapters: bool) -> Result<(), TrainError>;

    /// Runs `inputs` forward without gradients through the reference model and gives
    /// `on_logits` each input's logits, like [`ParallelWeights::forward_eval`] (collective
    /// when sharded), in the compute dtype: the weights with the copy
    /// [`ParallelWeights::keep_reference`] kept in place of the trained ones, or, with none
    /// kept, the current weights with the adapters off.
    fn forward_reference(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<(), TrainError>;

    /// Runs `inputs` (token ids) forward without gradients in the compute dtype (the param
    /// dtype under FSDP, cast before its all-gather; the master dtype under full precision)
    /// and gives `on_logits` each input's logits, one input at a time as each is done.
    /// Sharded weights walk the units once for all inputs, gathering a group at a time
    /// (collective: every rank calls it the same number of times, with any number of inputs,
    /// none included). Returns each input's load-balancing loss (unscaled, an fp32 scalar on
    /// the device, not read) when the model computes one (a mixture with
    /// `output_router_logits`), else nothing.
    fn forward_eval(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<Vec<Tensor>, TrainError>;
}
