//! The training loop: [`Trainer`] runs optimizer steps (data → unit engine → gradient
//! unscaling and clipping → AdamW at the scheduled learning rate) over [`ParallelWeights`]
//! (built once by `parallel::parallelize`; the loop never asks which parallelism), and reports one
//! [`MetricsRow`] per step, global over the ranks (loss summed over ranks of the globally
//! normalised per-rank losses, tokens/s summed), which a [`MetricsWriter`] appends to
//! `metrics.csv`. This file owns the loop and when the fp16 loss scale applies; the row format
//! is `flotilla_contract::metrics`', loss scaling `optim::loss_scale`'s, and checkpoints, evaluation and run
//! directories live in `checkpoint` and `fit`.

use std::sync::Arc;
use std::time::Instant;

use tch::{Device, Tensor};

use crate::data::{Batch, DataLoader, StepBatches};
use crate::error::TrainError;
use crate::host_memory::{HostPeaks, HostPhase};
use crate::model::{CausalLm, Params, TokenInput};
use crate::objective::{sequence_logps, DpoSums, Objective, AUX_LOSS_METRIC};
use crate::optim::loss_scale::LossScaler;
use crate::optim::schedule::Schedule;
use crate::parallel::engine::{Engine, EngineOptions};
use crate::parallel::parallelize::{parallelize, DistContext, Parallelized};
use crate::parallel::readings::read_together;
use crate::parallel::tensor_comm::TensorCollectives;
use crate::parallel::weights::{MemoryReport, ParallelWeights};
use crate::state::param_source::TensorSource;
use flotilla_comm::comm::{Communicator, ReduceOp};
use flotilla_config::schema::{self, DistConfig, Precision, TrainerConfig};
use flotilla_contract::metrics::{MetricsRow, MetricsWriter};

/// The torch device of `trainer.device` (`auto`: CUDA when available).
pub fn torch_device(device: schema::Device) -> Device {
    match device {
        schema::Device::Cpu => Device::Cpu,
        schema::Device::Cuda => Device::Cuda(0),
        schema::Device::Auto => crate::cuda::auto_device(),
    }
}

/// A trainer over a data loader: one process, or one rank of a DDP/FSDP job.
pub struct Trainer {
    pub(super) model: CausalLm,
    pub(super) weights: Box<dyn ParallelWeights>,
    pub(super) dist: Option<DistContext>,
    pub(super) schedule: Schedule,
    pub(super) loader: DataLoader,
    pub(super) options: EngineOptions,
    pub(super) grad_clip: f64,
    pub(super) scaler: Option<LossScaler>,
    pub(super) step: u64,
    pub(super) stop_requested: bool,
    pub(super) start: Instant,
    /// Peak host memory by phase of the run.
    pub(super) host: HostPeaks,
    /// The device the rank computes on.
    pub(super) device: Device,
    /// Preference tuning with `reference: precomputed`: the reference's log-probabilities of
    /// each training sample's chosen and rejected sequence (`2 * index`, `2 * index + 1`),
    /// and of the evaluation samples'.
    pub(super) reference_logps: Option<ReferenceLogps>,
}

/// The reference log-probabilities of every pair of the training and evaluation data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceLogps {
    pub train: Vec<f32>,
    pub eval: Option<Vec<f32>>,
}

impl Trainer {
    /// A single-process trainer for `model` starting from the parameters `params` gives (on
    /// `device` in the master dtype of `trainer.precision`). `trainer.dist` may be `ddp` or
    /// `fsdp` (then it runs as a world of one).
    pub fn new(
        model: CausalLm,
        params: &dyn TensorSource,
        config: &TrainerConfig,
        loader: DataLoader,
        device: Device,
    ) -> Result<Self, TrainError> {
        Self::distributed(model, params, config, loader, device, None)
    }

    /// A trainer for one rank of `dist` (or one process with `None`). Every rank must pass a
    /// source of the same parameters (DDP broadcasts rank 0's anyway, and so does FSDP with
    /// `sync_module_states`); FSDP ranks read only their shards of it. Collective when `dist`
    /// is given.
    pub fn distributed(
        model: CausalLm,
        params: &dyn TensorSource,
        config: &TrainerConfig,
        loader: DataLoader,
        device: Device,
        dist: Option<DistContext>,
    ) -> Result<Self, TrainError> {
        params.check(&model)?;
        let world = dist.as_ref().map_or(1, |d| d.comm.world_size());
        if world > 1 && matches!(config.dist, DistConfig::None) {
            return Err(TrainError::Unsupported(format!(
                "{world} ranks but trainer.dist.mode=none; use trainer/dist=ddp or trainer/dist=fsdp"
            )));
        }
        let Parallelized { weights, engine } =
            parallelize(&model, params, config, device, dist.as_ref())?;
        Ok(Self {
            model,
            weights,
            dist,
            schedule: Schedule {
                kind: config.schedule,
                lr: config.lr,
                min_lr: config.min_lr,
                warmup_steps: config.warmup_steps,
                max_steps: config.max_steps,
            },
            loader,
            options: engine,
            grad_clip: config.grad_clip,
            scaler: (config.precision == Precision::Fp16Mixed).then(LossScaler::new),
            step: 0,
            stop_requested: false,
            start: Instant::now(),
            host: HostPeaks::default(),
            device,
            reference_logps: None,
        })
    }

    /// Sets what the trainer minimises (next-token cross-entropy unless set). A preference
    /// objective's reference is the weights as they are now, kept here as a frozen copy with
    /// `keep_reference` ([`ParallelWeights::keep_reference`]: a LoRA job's adapters only
    /// `with_adapters`, else none, its reference being the base).
    pub fn set_objective(
        &mut self,
        objective: Objective,
        keep_reference: bool,
        with_adapters: bool,
    ) -> Result<(), TrainError> {
        self.options.objective = objective;
        if objective.is_preference() && keep_reference {
            self.weights.keep_reference(with_adapters)?;
        }
        Ok(())
    }

    pub fn objective(&self) -> Objective {
        self.options.objective
    }

    /// Precomputed reference log-probabilities, looked up by sample index instead of running
    /// the reference each step.
    pub fn set_reference_logps(&mut self, logps: ReferenceLogps) {
        self.reference_logps = Some(logps);
    }

    /// Gives every micro-batch of pairs its reference log-probabilities: from `table` (by
    /// sample index) or through the reference model (collective when sharded).
    pub(super) fn attach_reference(
        &mut self,
        batches: &mut StepBatches,
        table: Option<&[f32]>,
    ) -> Result<(), TrainError> {
        if let Some(table) = table {
            let mut at = 0;
            for b in &mut batches.micro_batches {
                let m = b.samples() as usize;
                let indices = &batches.indices[at..at + m];
                at += m;
                let chosen = indices.iter().map(|&i| table[2 * i]);
                let rejected = indices.iter().map(|&i| table[2 * i + 1]);
                let values: Vec<f32> = chosen.chain(rejected).collect();
                b.reference_logps = Some(Tensor::f_from_slice(&values)?.f_to_device(self.device)?);
            }
            return Ok(());
        }
        let logps = self.reference_logps_of(&batches.micro_batches)?;
        for (b, l) in batches.micro_batches.iter_mut().zip(logps) {
            b.reference_logps = Some(l);
        }
        Ok(())
    }

    /// The reference's summed completion log-probabilities of each row of `batches`
    /// (collective when sharded).
    pub fn reference_logps_of(&mut self, batches: &[Batch]) -> Result<Vec<Tensor>, TrainError> {
        let inputs: Vec<TokenInput> = batches.iter().map(Batch::model_input).collect();
        let mut out: Vec<Option<Tensor>> = (0..batches.len()).map(|_| None).collect();
        let (model, weights) = (&self.model, &mut self.weights);
        weights.forward_reference(model, &inputs, &mut |i, logits| {
            out[i] = Some(sequence_logps(&logits, &batches[i].labels));
            Ok(())
        })?;
        Ok(out
            .into_iter()
            .map(|l| l.expect("the reference gives every input's logits"))
            .collect())
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// This rank's weights (replicated or sharded, as `trainer.dist` says).
    pub fn weights(&self) -> &dyn ParallelWeights {
        self.weights.as_ref()
    }

    /// The device the rank computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// This rank's index and the world size.
    pub fn rank_world(&self) -> (usize, usize) {
        self.dist
            .as_ref()
            .map_or((0, 1), |d| (d.comm.rank(), d.comm.world_size()))
    }

    /// The world communicator, when distributed.
    pub fn comm(&self) -> Option<&Arc<dyn Communicator>> {
        self.dist.as_ref().map(|d| &d.comm)
    }

    /// The full parameters in the master dtype: the replicated tensors themselves, or (FSDP,
    /// collective) gathered from every shard.
    pub fn full_params(&self) -> Result<Params, TrainError> {
        self.weights.full_params()
    }

    /// Bytes this rank holds for parameters, gradients and optimizer state.
    pub fn memory(&self) -> MemoryReport {
        self.weights.memory()
    }

    /// FSDP: the most bytes of gathered (unsharded) parameters held at once so far.
    pub fn peak_gathered_bytes(&self) -> Option<usize> {
        self.weights.peak_gathered_bytes()
    }

    /// The current loss scale (16-mixed).
    pub fn loss_scaler(&self) -> Option<LossScaler> {
        self.scaler
    }

    /// Steps taken so far (the 0-based index of the next step).
    pub fn step_index(&self) -> u64 {
        self.step
    }

    /// Whether a stop (preemption signal on any rank) was agreed on at the last step.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested
    }

    /// One optimizer step (collective when distributed).
    /// The row has no evaluation figures; `fit.rs` adds them on evaluation steps.
    pub fn step(&mut self) -> Result<MetricsRow, TrainError> {
        self.host.begin();
        let row = self.step_unmeasured();
        self.host.end(HostPhase::Step);
        row
    }

    /// Peak host memory by phase so far (`host_memory.rs`).
    pub fn host_peaks(&self) -> &HostPeaks {
        &self.host
    }

    /// Whether each step's row has the load-balancing loss ([`AUX_LOSS_METRIC`]).
    pub fn logs_aux_loss(&self) -> bool {
        self.options.router_aux.is_some()
    }

    /// Peak host memory by phase, for the phases run outside the trainer's own calls.
    pub fn host_peaks_mut(&mut self) -> &mut HostPeaks {
        &mut self.host
    }

    fn step_unmeasured(&mut self) -> Result<MetricsRow, TrainError> {
        crate::error::torch_guard::set_step(self.step);
        let t0 = Instant::now();
        let mut batches = self.loader.next_step()?;
        if self.options.objective.is_preference() {
            let table = self.reference_logps.take();
            let attached =
                self.attach_reference(&mut batches, table.as_ref().map(|t| &t.train[..]));
            self.reference_logps = table;
            attached?;
        }
        let mut options = self.options;
        options.loss_scale = self.scaler.map_or(1.0, |s| s.scale);
        let world_size = self.dist.as_ref().map_or(1, |d| d.comm.world_size());
        if let Some(aux) = &mut options.router_aux {
            aux.share = 1.0 / (batches.micro_batches.len().max(1) * world_size) as f64;
        }
        // Dropout masks depend on the step, so a resumed run draws the same ones.
        options.dropout_seed = options
            .dropout_seed
            .map(|s| s ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let engine = Engine::new(&self.model, options);
        let lr = self.schedule.lr_at(self.step);
        let inv_scale = 1.0 / options.loss_scale;
        let weights = &mut self.weights;
        let local_loss = weights.forward_backward(&engine, &batches)?;
        let sums = engine.take_sums();
        let aux_loss = engine.take_aux_loss();
        // fp16: the update skips by the found-inf flag on the device, read below.
        let found_inf = match self.scaler {
            Some(_) => Some(weights.unscale_grads(inv_scale)?),
            None => None,
        };
        let grad_norm = weights.clip_grad_norm(self.grad_clip)?;
        weights.optimizer_step(lr, found_inf.as_ref())?;
        weights.end_step()?;
        // The step's one read: its figures stayed on the device until the update was queued.
        let mut figures = vec![&local_loss, &grad_norm];
        figures.extend(found_inf.as_ref());
        figures.extend(aux_loss.as_ref());
        figures.extend(sums.as_ref());
        let mut read = read_together(&figures)?.into_iter();
        let mut next = || read.next().expect("a value for every figure");
        let (local_loss, grad_norm) = (next(), next());
        let skipped = found_inf.is_some() && next() != 0.0;
        let aux_loss = aux_loss.map(|_| next());
        let sums = sums.map(|_| DpoSums::from_slice(&read.collect::<Vec<_>>()));
        if let Some(s) = &mut self.scaler {
            if skipped {
                weights.forget_step();
            }
            s.update(skipped);
        }
        let local_tokens: i64 = batches
            .micro_batches
            .iter()
            .map(|b| b.input_ids.numel() as i64)
            .sum();
        let stop_here = crate::preempt::requested();
        let (loss, stop, world, sums, aux_loss) = match &self.dist {
            Some(d) => {
                // The loss travels as an f32 pair (value, rounding remainder) so that its sum
                // keeps f64 precision; the third entry is the stop flag, then a preference
                // objective's sums.
                let hi = local_loss as f32;
                let lo = (local_loss - hi as f64) as f32;
                // The fourth is the load-balancing loss's share (0 without one).
                let mut values = vec![
                    hi,
                    lo,
                    stop_here as i32 as f32,
                    aux_loss.unwrap_or(0.0) as f32,
                ];
                if let Some(s) = &sums {
                    values.extend(s.to_vec().iter().map(|&x| x as f32));
                }
                let v = d.comm.all_reduce_host(&values, ReduceOp::Sum)?;
                let sums = sums.map(|_| {
                    DpoSums::from_slice(&v[4..].iter().map(|&x| x as f64).collect::<Vec<_>>())
                });
                (
                    v[0] as f64 + v[1] as f64,
                    v[2] > 0.0,
                    d.comm.world_size(),
                    sums,
                    aux_loss.map(|_| v[3] as f64),
                )
            }
            _ => (local_loss, stop_here, 1, sums, aux_loss),
        };
        self.stop_requested = stop;
        let row = MetricsRow {
            step: self.step,
            loss,
            grad_norm,
            lr,
            tokens_per_s: (local_tokens as f64 * world as f64)
                / t0.elapsed().as_secs_f64().max(1e-9),
            elapsed_s: self.start.elapsed().as_secs_f64(),
            eval_loss: None,
            eval_ppl: None,
            eval_acc: None,
            extra: sums
                .map_or_else(Vec::new, |s| {
                    s.metrics()
                        .into_iter()
                        .map(|(name, v)| (name.to_string(), v))
                        .collect()
                })
                .into_iter()
                .chain(aux_loss.map(|v| (AUX_LOSS_METRIC.to_string(), v)))
                .collect(),
        };
        self.step += 1;
        Ok(row)
    }

    /// Runs `steps` steps, writing each row to `metrics` when given; returns the rows.
    pub fn run(
        &mut self,
        steps: u64,
        mut metrics: Option<&mut MetricsWriter>,
    ) -> Result<Vec<MetricsRow>, TrainError> {
        let mut rows = Vec::with_capacity(steps as usize);
        for _ in 0..steps {
            let row = self.step()?;
            if let Some(w) = metrics.as_deref_mut() {
                w.write(&row)?;
            }
            rows.push(row);
        }
        Ok(rows)
    }
}
