//! Strategies where every rank holds every parameter: one process, and DDP. This file owns
//! the [`Replicated`] weights (parameters, their AdamW state and the compute dtype), the
//! engine strategy over them, and DDP's gradient reducer: gradients are flattened into
//! buckets of `bucket_cap_mb` in the order they become final (reverse unit order) and each
//! bucket is all-reduced asynchronously as soon as it fills, so communication overlaps the
//! backward of earlier units; the engine reports gradients only on the last micro-batch of a
//! step, so gradient accumulation never reduces.
//!
//! Reductions are sums: every rank normalises its loss by the token count of the whole global
//! batch, so the sum over ranks is the gradient of the global mean loss.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::data::StepBatches;
use crate::error::TrainError;
use crate::model::{CausalLm, Params, TokenInput};
use crate::optim::loss_scale::unscale;
use crate::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::parallel::engine::{eval_aux_loss, eval_ctx, forward_by_unit, Engine, Strategy};
use crate::parallel::tensor_comm::TensorCollectives;
use crate::parallel::weights::{
    nbytes, FullStateVisitor, HeldTensors, MemoryReport, OptimizerSource, ParallelWeights,
    StatePart,
};
use crate::state::param_source::TensorSource;
use flotilla_comm::comm::{Communicator, ReduceOp, Work};
use flotilla_config::schema::DdpConfig;

/// Parameters replicated on this rank, with their optimizer.
#[derive(Debug)]
pub struct Replicated {
    /// Master weights (fp32, or bf16 for `bf16-true`).
    pub params: Params,
    pub optimizer: AdamW,
    /// Dtype the units compute in when it differs from the master weights (mixed precision).
    pub compute_kind: Option<Kind>,
    /// DDP's gradient reducer; `None` in one process.
    pub reducer: Option<GradReducer>,
    /// This step's gradients (reduced, under DDP), from backward to the optimizer step.
    grads: Params,
    /// Parameters not trained (a LoRA job's base): no gradient, no optimizer state, not in
    /// checkpoints.
    frozen: HashSet<String>,
    /// Preference tuning's frozen reference, in the compute dtype
    /// ([`ParallelWeights::keep_reference`]).
    reference: Option<Params>,
}

impl Replicated {
    /// Weights over `params`, of which `model`'s frozen ones are not trained.
    pub fn new(
        model: &CausalLm,
        params: Params,
        config: AdamWConfig,
        compute_kind: Option<Kind>,
    ) -> Self {
        Self {
            params,
            optimizer: AdamW::new(config),
            compute_kind,
            reducer: None,
            grads: Params::new(),
            frozen: model
                .param_specs()
                .iter()
                .filter(|s| !s.trainable)
                .map(|s| s.name.clone())
                .collect(),
            reference: None,
        }
    }

    /// Drops the step's gradients (under DDP, the buckets they are views of).
    fn release_grads(&mut self) {
        self.grads = Params::new();
        if let Some(r) = self.reducer.as_mut() {
            r.release();
        }
    }

    /// The engine strategy over these weights for one step.
    pub fn strategy(&mut self) -> ReplicatedStrategy<'_> {
        ReplicatedStrategy {
            params: &self.params,
            compute_kind: self.compute_kind,
            reducer: self.reducer.as_mut(),
        }
    }
}

impl ParallelWeights for Replicated {
    fn forward_backward(
        &mut self,
        engine: &Engine<'_>,
        batches: &StepBatches,
    ) -> Result<Tensor, TrainError> {
        let (loss, grads) = engine.forward_backward(
            &mut self.strategy(),
            &batches.micro_batches,
            engine.normaliser(batches),
        )?;
        self.grads = grads;
        Ok(loss)
    }

    /// DDP gradients are identical on every rank here, so is the flag: no communication.
    fn unscale_grads(&mut self, inv_scale: f64) -> Result<Tensor, TrainError> {
        unscale(self.grads.iter().map(|(_, g)| g), inv_scale)
    }

    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<Tensor, TrainError> {
        clip_grad_norm(&self.grads, max_norm)
    }

    fn optimizer_step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), TrainError> {
        self.optimizer
            .step_unless(&self.params, &self.grads, lr, found_inf)
    }

    fn forget_step(&mut self) {
        self.optimizer.forget_step();
    }

    fn end_step(&mut self) -> Result<(), TrainError> {
        self.release_grads();
        Ok(())
    }

    /// The replicated tensors themselves (no copy).
    fn full_params(&self) -> Result<Params, TrainError> {
        let mut out = Params::new();
        for (n, t) in self.params.iter() {
            out.insert(n, t.shallow_clone());
        }
        Ok(out)
    }

    /// Bytes held for parameters, gradients (one fp32 copy per parameter during the step) and
    /// optimizer state.
    fn memory(&self) -> MemoryReport {
        let params: usize = self.params.iter().map(|(_, t)| nbytes(t)).sum();
        let grads: usize = self.params.iter().map(|(_, t)| t.numel() * 4).sum();
        let optimizer: usize = self
            .optimizer
            .state()
            .values()
            .map(|s| nbytes(&s.exp_avg) + nbytes(&s.exp_avg_sq))
            .sum();
        MemoryReport {
            params,
            grads,
            optimizer,
        }
    }

    fn peak_gathered_bytes(&self) -> Option<usize> {
        None
    }

    fn held_tensors(&self) -> HeldTensors {
        let all = |p: &Params| p.iter().map(|(_, t)| t.shallow_clone()).collect();
        HeldTensors {
            params: all(&self.params),
            grads: all(&self.grads),
            optimizer: self
                .optimizer
                .state()
                .values()
                .flat_map(|s| [s.exp_avg.shallow_clone(), s.exp_avg_sq.shallow_clone()])
                .collect(),
            reference: self.reference.as_ref().map(all).unwrap_or_default(),
        }
    }

    /// Trained parameters in model order (a LoRA job's frozen base is not state: it comes
    /// from the base model); moments of the parameters that have them.
    fn full_layout(&self, part: StatePart) -> Vec<(String, Vec<i64>, Kind)> {
        let state = self.optimizer.state();
        self.params
            .iter()
            .filter(|(n, _)| match part {
                StatePart::Params => !self.frozen.contains(*n),
                StatePart::Model => true,
                _ => state.contains_key(*n),
            })
            .map(|(n, t)| (n.to_string(), t.size(), t.kind()))
            .collect()
    }

    /// The tensors themselves, no communication.
    fn visit_full(
        &self,
        part: StatePart,
        visit: Option<FullStateVisitor<'_>>,
    ) -> Result<(), TrainError> {
        let Some(visit) = visit else { return Ok(()) };
        let state = self.optimizer.state();
        for (name, p) in self.params.iter() {
            match (part, state.get(name)) {
                (StatePart::Params, _) if self.frozen.contains(name) => {}
                (StatePart::Params | StatePart::Model, _) => visit(name, p)?,
                (StatePart::ExpAvg, Some(s)) => visit(name, &s.exp_avg)?,
                (StatePart::ExpAvgSq, Some(s)) => visit(name, &s.exp_avg_sq)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn optimizer_steps(&self) -> u64 {
        self.optimizer.steps()
    }

    /// Copies each trained parameter in place, one read from the source at a time; the
    /// moments are read in the parameters' device and dtype.
    fn load_state(
        &mut self,
        params: &dyn TensorSource,
        optimizer: Option<OptimizerSource<'_>>,
    ) -> Result<(), TrainError> {
        tch::no_grad(|| -> Result<(), TrainError> {
            for (name, p) in self.params.iter() {
                if self.frozen.contains(name) {
                    continue;
                }
                let src = params.read_range(name, 0, p.numel() as i64)?;
                p.shallow_clone()
                    .f_copy_(&src.f_view(p.size().as_slice())?)?;
            }
            Ok(())
        })?;
        let Some(o) = optimizer else { return Ok(()) };
        let mut tensors = vec![("step".to_string(), Tensor::from(o.step as i64))];
        for (name, p) in self.params.iter() {
            if !o.with_moments.iter().any(|m| m == name) {
                continue;
            }
            for (suffix, source) in [(".exp_avg", o.exp_avg), (".exp_avg_sq", o.exp_avg_sq)] {
                let t = source
                    .read_range(name, 0, p.numel() as i64)?
                    .f_to_device(p.device())?
                    .f_to_kind(p.kind())?
                    .f_view(p.size().as_slice())?;
                tensors.push((format!("{name}{suffix}"), t));
            }
        }
        self.optimizer.load_state_tensors(tensors)
    }

    /// The whole model on each input in turn (no communication), in the master dtype; a LoRA
    /// job's (whose frozen base is held in the compute dtype) unit by unit in the compute
    /// dtype, as it trains.
    fn keep_reference(&mut self, with_adapters: bool) -> Result<(), TrainError> {
        if !self.frozen.is_empty() && !with_adapters {
            return Ok(());
        }
        let kind = self.compute_kind;
        let mut copy = Params::new();
        for (name, t) in self.params.iter() {
            if self.frozen.contains(name) {
                continue;
            }
            let t = match kind {
                Some(k) => t.f_to_kind(k)?,
                None => t.f_detach_copy()?,
            };
            copy.insert(name, t.detach());
        }
        self.reference = Some(copy);
        Ok(())
    }

    fn forward_reference(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        // The kept copy in place of the trained weights; the frozen ones are shared.
        let mut params = Params::new();
        for (name, t) in self.params.iter() {
            let t = self
                .reference
                .as_ref()
                .and_then(|r| r.get(name))
                .unwrap_or(t);
            params.insert(name, t.shallow_clone());
        }
        let adapters_off = self.reference.is_none();
        forward_cast(
            model,
            inputs,
            &params,
            self.compute_kind,
            adapters_off,
            on_logits,
        )
        .map(|_| ())
    }

    fn forward_eval(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<Vec<Tensor>, TrainError> {
        let _guard = tch::no_grad_guard();
        match self.compute_kind {
            // In the compute dtype, as training's forward (HF Trainer and Lightning evaluate
            // under autocast too): each unit's weights cast as it runs.
            Some(kind) => forward_cast(model, inputs, &self.params, Some(kind), false, on_logits),
            None => {
                let mut aux = vec![];
                for (i, x) in inputs.iter().enumerate() {
                    let ctx = eval_ctx(model, x);
                    on_logits(i, model.forward_with(&self.params, x, &ctx)?)?;
                    aux.extend(eval_aux_loss(model, &ctx));
                }
                Ok(aux)
            }
        }
    }
}

/// `inputs` forward unit by unit without gradients on `params`, each unit's tensors cast to
/// `kind` when given (a LoRA job's mixed masters and frozen base), the adapters off or on.
fn forward_cast(
    model: &CausalLm,
    inputs: &[TokenInput],
    params: &Params,
    kind: Option<Kind>,
    adapters_off: bool,
    on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
) -> Result<Vec<Tensor>, TrainError> {
    let mut params_for = |u: usize| -> Result<Vec<Tensor>, TrainError> {
        let unit = model.unit_params(u, params)?;
        match kind {
            Some(k) => unit.into_iter().map(|p| Ok(p.f_to_kind(k)?)).collect(),
            None => Ok(unit),
        }
    };
    forward_by_unit(
        model,
        inputs,
        adapters_off,
        &mut params_for,
        &mut |_| Ok(()),
        on_logits,
    )
}

/// The engine strategy over [`Replicated`] weights.
pub struct ReplicatedStrategy<'a> {
    params: &'a Params,
    compute_kind: Option<Kind>,
    reducer: Option<&'a mut GradReducer>,
}

impl Strategy for ReplicatedStrategy<'_> {
    fn params_for(&mut self, model: &CausalLm, unit: usize) -> Result<Vec<Tensor>, TrainError> {
        let params = model.unit_params(unit, self.params)?;
        match self.compute_kind {
            Some(kind) => Ok(params
                .into_iter()
                .map(|p| p.f_to_kind(kind))
                .collect::<Result<_, _>>()?),
            None => Ok(params),
        }
    }

    fn gradient_storage(&mut self, name: &str) -> Result<Option<Tensor>, TrainError> {
        match self.reducer.as_deref_mut() {
            Some(r) => r.storage(name),
            None => Ok(None),
        }
    }

    fn gradients_ready(&mut self, unit: usize, _grads: &Params) -> Result<(), TrainError> {
        match self.reducer.as_deref_mut() {
            Some(r) => r.unit_ready(unit),
            None => Ok(()),
        }
    }

    fn finish_backward(&mut self, last: bool) -> Result<(), TrainError> {
        match self.reducer.as_deref_mut() {
            Some(r) if last => r.finish(),
            _ => Ok(()),
        }
    }
}

/// One bucket: the gradients of consecutive units, in backward order, in one flat fp32 tensor
/// that the gradients are views of.
struct Bucket {
    /// The lowest unit whose gradients it holds: the bucket is complete, and its all-reduce
    /// starts, once that unit's gradients are ready.
    lowest_unit: usize,
    numel: i64,
    /// Allocated (zeroed) at the step's first gradient into the bucket, dropped at the end of
    /// the step.
    flat: Option<Tensor>,
    work: Option<Work<'static>>,
}

/// Where one parameter's gradient lives in the buckets.
struct Slot {
    bucket: usize,
    offset: i64,
    shape: Vec<i64>,
}

/// DDP's bucketed, asynchronous gradient all-reduce. The buckets are the gradients' storage
/// (PyTorch's `gradient_as_bucket_view`): the engine accumulates each gradient in a view of
/// its bucket, and the all-reduce sums the bucket in place, so no gradient is copied.
pub struct GradReducer {
    comm: Arc<dyn Communicator>,
    device: Device,
    buckets: Vec<Bucket>,
    slots: HashMap<String, Slot>,
    /// Buckets launched so far (for tests and logs).
    pub buckets_launched: u64,
}

impl std::fmt::Debug for GradReducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradReducer")
            .field("buckets", &self.buckets.len())
            .field("buckets_launched", &self.buckets_launched)
            .finish()
    }
}

impl GradReducer {
    /// Buckets over the gradients of the trained parameters of `model` in `params`, laid out
    /// by [`DdpConfig::buckets`] (whole units, in the order their gradients become final), each
    /// unit's owned parameters in model order.
    pub fn new(
        comm: Arc<dyn Communicator>,
        ddp: &DdpConfig,
        model: &CausalLm,
        params: &Params,
    ) -> Self {
        let device = params
            .iter()
            .next()
            .map_or(Device::Cpu, |(_, t)| t.device());
        let trained = |unit: usize| {
            model
                .owned_params(unit)
                .filter(|s| s.trainable && params.get(&s.name).is_some())
        };
        let per_unit: Vec<u64> = (0..model.units().len())
            .map(|u| trained(u).map(|s| s.numel() as u64).sum())
            .collect();
        let mut buckets = vec![];
        let mut slots = HashMap::new();
        for range in ddp.buckets(&per_unit) {
            let mut numel = 0;
            for unit in range.clone().rev() {
                for spec in trained(unit) {
                    let slot = Slot {
                        bucket: buckets.len(),
                        offset: numel,
                        shape: spec.shape.clone(),
                    };
                    numel += spec.numel() as i64;
                    slots.insert(spec.name.clone(), slot);
                }
            }
            buckets.push(Bucket {
                lowest_unit: range.start,
                numel,
                flat: None,
                work: None,
            });
        }
        Self {
            comm,
            device,
            buckets,
            slots,
            buckets_launched: 0,
        }
    }

    /// The number of buckets.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// The zeroed view of its bucket that parameter `name`'s gradient accumulates in; `None`
    /// for a parameter that is not trained.
    fn storage(&mut self, name: &str) -> Result<Option<Tensor>, TrainError> {
        let Some(slot) = self.slots.get(name) else {
            return Ok(None);
        };
        let flat = self.buckets[slot.bucket].allocate(self.device)?;
        let n: i64 = slot.shape.iter().product();
        Ok(Some(
            flat.f_narrow(0, slot.offset, n)?
                .f_view(slot.shape.as_slice())?,
        ))
    }

    /// Unit `unit`'s gradients are final: launches the all-reduce of the bucket it completes.
    fn unit_ready(&mut self, unit: usize) -> Result<(), TrainError> {
        if let Some(i) = self.buckets.iter().position(|b| b.lowest_unit == unit) {
            self.launch(i)?;
        }
        Ok(())
    }

    fn launch(&mut self, i: usize) -> Result<(), TrainError> {
        let bucket = &mut self.buckets[i];
        if bucket.work.is_some() {
            return Ok(());
        }
        let flat = bucket.allocate(self.device)?;
        bucket.work = Some(self.comm.all_reduce_tensor(&flat, ReduceOp::Sum)?);
        self.buckets_launched += 1;
        Ok(())
    }

    /// Launches any bucket not launched yet (in order, the same on every rank) and waits for
    /// every all-reduce: the gradients then hold the sums.
    fn finish(&mut self) -> Result<(), TrainError> {
        for i in 0..self.buckets.len() {
            self.launch(i)?;
        }
        for bucket in &mut self.buckets {
            if let Some(work) = bucket.work.take() {
                work.wait()?;
            }
        }
        Ok(())
    }

    /// Drops the buckets' storage (the step's gradients) and any all-reduce left in flight.
    fn release(&mut self) {
        for bucket in &mut self.buckets {
            bucket.work = None;
            bucket.flat = None;
        }
    }
}

impl Bucket {
    /// The bucket's flat tensor, allocated and zeroed on first use in the step.
    fn allocate(&mut self, device: Device) -> Result<Tensor, TrainError> {
        if self.flat.is_none() {
            self.flat = Some(Tensor::f_zeros([self.numel], (Kind::Float, device))?);
        }
        Ok(self.flat.as_ref().expect("allocated above").shallow_clone())
    }
}

/// The tensors flattened and concatenated, in order (a new tensor).
fn concat_flat(tensors: &[Tensor]) -> Result<Tensor, TrainError> {
    let flat: Vec<Tensor> = tensors.iter().map(|t| t.reshape([-1])).collect();
    Ok(Tensor::f_cat(&flat, 0)?)
}

/// Copies consecutive pieces of `flat` back into `tensors` (the inverse of [`concat_flat`]).
fn copy_from_flat(flat: &Tensor, tensors: &[Tensor]) -> Result<(), TrainError> {
    let mut offset = 0;
    tch::no_grad(|| {
        for t in tensors {
            let n = t.numel() as i64;
            t.shallow_clone()
                .f_copy_(&flat.f_narrow(0, offset, n)?.f_view(t.size().as_slice())?)?;
            offset += n;
        }
        Ok(())
    })
}

/// Copies rank 0's parameters into every rank's (DDP's start-up broadcast), one flat
/// broadcast per dtype.
pub fn broadcast_params(comm: &dyn Communicator, params: &Params) -> Result<(), TrainError> {
    let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    if tensors.is_empty() {
        return Ok(());
    }
    let flat = concat_flat(&tensors)?;
    comm.broadcast_tensor(&flat, 0)?.wait()?;
    copy_from_flat(&flat, &tensors)
}
