//! The single-process unit engine (docs/ARCHITECTURE.md, "The unit engine"): forward unit by
//! unit, each unit on the previous output detached into a fresh leaf, backward unit by unit in
//! reverse with [`vjp`], parameter gradients accumulated across micro-batches (tied weights
//! summed over their readers), and optional activation checkpointing (keep only each unit's
//! input, recompute in backward).
//!
//! Where the parameters come from and what happens to finished gradients is the business of a
//! [`Strategy`]; this file owns the strategy contract and the single-process strategy
//! ([`SingleProcess`]). DDP and FSDP plug in through the same trait.

use std::cell::RefCell;

use tch::{Kind, Tensor};

use crate::data::{Batch, StepBatches};
use crate::error::TrainError;
use crate::model::layers::moe::{load_balancing, RouterLog};
use crate::model::{vjp, CausalLm, ForwardCtx, Params, TokenInput};
use crate::objective::fused_head::fused_head_loss;
use crate::objective::Objective;
use crate::parallel::readings::add_into;

/// How the engine gets parameters and hands over gradients.
pub trait Strategy {
    /// The tensors unit `unit` reads, in its [`crate::model::Unit::param_names`] order (for
    /// FSDP: gathered). The engine wraps each in a fresh leaf that requires grad (sharing
    /// storage), so they need not require grad themselves. Called in forward, and again in
    /// backward for a recomputed (checkpointed) unit.
    fn params_for(&mut self, model: &CausalLm, unit: usize) -> Result<Vec<Tensor>, TrainError>;

    /// Unit `unit`'s backward through its saved graph is next: the graph holds views of the
    /// tensors [`Strategy::params_for`] gave in forward, which must hold those values again
    /// (FSDP gathers a freed group back into its storage). Not called for a recomputed unit,
    /// which calls `params_for`. Default: nothing.
    fn before_backward(&mut self, _model: &CausalLm, _unit: usize) -> Result<(), TrainError> {
        Ok(())
    }

    /// The engine no longer needs unit `unit`'s parameters until its next `params_for` (FSDP
    /// may free gathered storage). Default: nothing.
    fn release(&mut self, _unit: usize) -> Result<(), TrainError> {
        Ok(())
    }

    /// The gradients of the parameters unit `unit` owns ([`CausalLm::owned_params`]) are final for
    /// this optimizer step (accumulated over every micro-batch), or, when the strategy
    /// [reduces every micro-batch](Strategy::reduces_every_micro_batch), for this micro-batch;
    /// tied-weight contributions of later readers included. Called once per unit per step (per
    /// micro-batch), after the backward through `unit`, in reverse unit order. The tensors are
    /// the engine's accumulators; a strategy may reduce them in place (DDP all-reduce).
    fn gradients_ready(&mut self, unit: usize, grads: &Params) -> Result<(), TrainError>;

    /// Where parameter `name`'s fp32 gradient accumulator lives, asked when the step's first
    /// gradient of it arrives: a zeroed tensor of the parameter's shape that the engine writes
    /// the gradient into and accumulates in (DDP: a view of its bucket, so the bucket
    /// all-reduce needs no second copy). `None`: the engine keeps the gradient it computed.
    /// Default: `None`.
    fn gradient_storage(&mut self, _name: &str) -> Result<Option<Tensor>, TrainError> {
        Ok(None)
    }

    /// A micro-batch's forward starts. Default: nothing.
    fn begin_forward(&mut self) {}

    /// A micro-batch's backward starts (after the loss). Default: nothing.
    fn begin_backward(&mut self) {}

    /// Whether [`Strategy::gradients_ready`] fires on every micro-batch with that micro-batch's
    /// gradients (FSDP reduce-scatters each into its sharded accumulator, so no unsharded
    /// accumulator outlives a unit's backward) instead of once per step with the sums.
    /// Default: false.
    fn reduces_every_micro_batch(&self) -> bool {
        false
    }

    /// Whether [`Strategy::gradients_ready`] takes the gradients over (FSDP reduces them into
    /// its own shards): the engine then drops its full-size accumulators of that unit's
    /// parameters right after the call, and the gradients [`Engine::forward_backward`] returns
    /// leave them out. Default: false.
    fn takes_gradients(&self) -> bool {
        false
    }

    /// A micro-batch's backward is done (`last`: the step's last): wait for the gradient
    /// collectives still in flight and leave the reduced gradients in place. Default: nothing.
    fn finish_backward(&mut self, _last: bool) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The single-process strategy: parameters are plain tensors, gradients need nothing.
#[derive(Debug)]
pub struct SingleProcess<'a> {
    pub params: &'a Params,
}

impl Strategy for SingleProcess<'_> {
    fn params_for(&mut self, model: &CausalLm, unit: usize) -> Result<Vec<Tensor>, TrainError> {
        Ok(model.unit_params(unit, self.params)?)
    }

    fn gradients_ready(&mut self, _unit: usize, _grads: &Params) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Engine options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineOptions {
    /// Keep only each unit's input in forward and recompute the unit in backward (the last
    /// unit, whose backward follows at once, is never recomputed).
    pub activation_checkpointing: bool,
    /// Multiplies the loss before backward (fp16 dynamic loss scaling); 1 otherwise. The
    /// returned loss is unscaled; the gradients are scaled.
    pub loss_scale: f64,
    /// The step's dropout seed (LoRA dropout); each micro-batch derives its own from it.
    /// `None`: no dropout.
    pub dropout_seed: Option<u64>,
    /// The loss.
    pub objective: Objective,
    /// A mixture of experts' load-balancing loss, added to the differentiated loss; `None`:
    /// none (a dense model, or `output_router_logits` off).
    pub router_aux: Option<RouterAux>,
    /// How next-token cross-entropy meets the head.
    pub loss_chunks: LossChunks,
}

/// How next-token cross-entropy meets the model's head. DPO, which needs each sequence's
/// log-probabilities, always takes the whole logits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossChunks {
    /// The head and the loss fused ([`fused_head_loss`]), in chunks of
    /// [`ModelConfig::loss_chunk_rows`](flotilla_config::schema::ModelConfig::loss_chunk_rows)
    /// tokens.
    #[default]
    Auto,
    /// Fused, in chunks of this many tokens.
    Rows(usize),
    /// The whole micro-batch's logits at once, then the objective's loss (the reference).
    Whole,
}

/// How the load-balancing loss enters a step: each micro-batch's loss (transformers'
/// `load_balancing_loss_func` over its tokens and every sparse layer) times `coef`
/// (`router_aux_loss_coef`) times `share`, so that the step differentiates `coef` times the
/// mean of the loss over its micro-batches on every rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterAux {
    pub coef: f64,
    /// One micro-batch's share of the step: 1 / (micro-batches per rank × ranks).
    pub share: f64,
    pub num_experts: i64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            activation_checkpointing: false,
            loss_scale: 1.0,
            dropout_seed: None,
            objective: Objective::NextToken,
            router_aux: None,
            loss_chunks: LossChunks::Auto,
        }
    }
}

/// Drives forward and backward of a [`CausalLm`] unit by unit.
#[derive(Debug)]
pub struct Engine<'m> {
    pub model: &'m CausalLm,
    pub options: EngineOptions,
    /// A preference objective's sums over the micro-batches run so far.
    sums: RefCell<Option<Tensor>>,
    /// The load-balancing loss of the micro-batches run so far, each times its share (on the
    /// device, read once by [`Engine::take_aux_loss`]).
    aux_loss: RefCell<Option<Tensor>>,
}

/// What the forward pass keeps of one unit for its backward.
struct Saved {
    /// The unit's input: token ids for unit 0, else a leaf that requires grad.
    input: Tensor,
    kept: Kept,
}

/// How a unit's backward gets its gradients.
enum Kept {
    /// Leaf parameter handles and the output with its graph.
    Graph(Vec<Tensor>, Tensor),
    /// Nothing: checkpointed, the unit is run again from its input.
    Recompute,
    /// The head's gradients, already computed with the fused loss (in [`vjp`]'s order).
    Done(Vec<Option<Tensor>>),
}

/// The unit's parameters as the graph's leaves: a trainable one becomes a fresh leaf that
/// requires grad (sharing storage), a frozen one (a LoRA job's base) stays as it is, so no
/// gradient is computed for it.
fn leaves(model: &CausalLm, unit: usize, params: Vec<Tensor>) -> Vec<Tensor> {
    params
        .into_iter()
        .zip(model.trainable_mask(unit))
        .map(|(p, &t)| {
            if t {
                p.detach().set_requires_grad(true)
            } else {
                p
            }
        })
        .collect()
}

impl<'m> Engine<'m> {
    pub fn new(model: &'m CausalLm, options: EngineOptions) -> Self {
        Self {
            model,
            options,
            sums: RefCell::new(None),
            aux_loss: RefCell::new(None),
        }
    }

    /// The load-balancing loss of the micro-batches run so far, each weighted by its share of
    /// the step (this rank's part of the step's mean), which it leaves at zero; `None` without
    /// one. A scalar on the device, not read.
    pub fn take_aux_loss(&self) -> Option<Tensor> {
        self.aux_loss.borrow_mut().take()
    }

    /// What a step's summed loss is divided by under this engine's objective.
    pub fn normaliser(&self, batches: &StepBatches) -> u64 {
        self.options
            .objective
            .normaliser(batches.global_loss_tokens, batches.global_samples)
    }

    /// A preference objective's sums over the micro-batches run so far (this rank's), which
    /// it leaves at zero.
    pub fn take_sums(&self) -> Option<Tensor> {
        self.sums.borrow_mut().take()
    }

    /// Forward and backward over the micro-batches of one optimizer step. Returns the step's
    /// loss (the sum over micro-batches of `loss_sum / global_loss_tokens`, a float64 scalar on
    /// the device, not read: see [`super::readings`]) and the gradients
    /// of every parameter that has one, by name (`global_loss_tokens`: the step's normaliser,
    /// [`Engine::normaliser`]). The strategy's
    /// [`Strategy::gradients_ready`] fires during the last micro-batch's backward.
    pub fn forward_backward(
        &self,
        strategy: &mut dyn Strategy,
        batches: &[Batch],
        global_loss_tokens: u64,
    ) -> Result<(Tensor, Params), TrainError> {
        let mut grads = Params::new();
        // Each micro-batch's loss stays on the device (in f64, as it was summed on the host);
        // the trainer reads their sum once, after the optimizer update.
        let mut loss: Option<Tensor> = None;
        for (k, batch) in batches.iter().enumerate() {
            let last = k + 1 == batches.len();
            let seed = self
                .options
                .dropout_seed
                .map(|s| s.wrapping_mul(0x100_0000_01B3).wrapping_add(k as u64));
            let micro =
                self.micro_step(strategy, batch, global_loss_tokens, &mut grads, last, seed)?;
            add_into(&mut loss, micro)?;
        }
        let loss = match loss {
            Some(sum) => sum,
            None => Tensor::f_zeros([], (tch::Kind::Double, tch::Device::Cpu))?,
        };
        Ok((loss, grads))
    }

    /// Forward and backward of one micro-batch, adding its parameter gradients into `grads`
    /// (created on first use). With `last`, calls [`Strategy::gradients_ready`] for each unit
    /// as its gradients become final; `dropout_seed` seeds its dropout masks (`None`: no
    /// dropout). Returns `loss_sum / global_loss_tokens`, a float64 scalar on the device (not
    /// read: no host sync between forward and backward).
    pub fn micro_step(
        &self,
        strategy: &mut dyn Strategy,
        batch: &Batch,
        global_loss_tokens: u64,
        grads: &mut Params,
        last: bool,
        dropout_seed: Option<u64>,
    ) -> Result<Tensor, TrainError> {
        let model = self.model;
        let units = model.units();
        let n = units.len();
        let mut ctx = model.ctx_for_input(&batch.model_input());
        ctx.dropout_seed = dropout_seed;
        let aux = self.options.router_aux;
        if aux.is_some() {
            ctx.router_log = Some(RouterLog::default());
        }
        let checkpoint = |i: usize| self.options.activation_checkpointing && i + 1 < n;

        // Forward.
        strategy.begin_forward();
        let mut saved: Vec<Saved> = Vec::with_capacity(n);
        let mut x = batch.input_ids.shallow_clone();
        let fused_rows = self.fused_head_rows(batch);
        let scale = self.options.loss_scale / global_loss_tokens as f64;
        let mut fused_loss: Option<Tensor> = None;
        for (i, unit) in units.iter().enumerate() {
            let input = if i == 0 {
                x
            } else {
                x.detach().set_requires_grad(true)
            };
            let params = strategy.params_for(model, i)?;
            if let (Some(rows), true) = (fused_rows, i + 1 == n) {
                // The head with the loss, and their backward, a chunk of tokens at a time.
                let params = leaves(model, i, params);
                let head = fused_head_loss(
                    unit.as_ref(),
                    &params,
                    model.trainable_mask(i),
                    &input,
                    i > 0,
                    &batch.labels,
                    rows,
                    scale,
                    &ctx,
                )?;
                fused_loss = Some(head.loss_sum);
                saved.push(Saved {
                    input,
                    kept: Kept::Done(head.grads),
                });
                x = Tensor::new();
            } else if checkpoint(i) {
                x = tch::no_grad(|| unit.forward(&params, &input, &ctx));
                saved.push(Saved {
                    input,
                    kept: Kept::Recompute,
                });
            } else {
                let params = leaves(model, i, params);
                x = unit.forward(&params, &input, &ctx);
                let output = x.shallow_clone();
                saved.push(Saved {
                    input,
                    kept: Kept::Graph(params, output),
                });
            }
            if i + 1 < n {
                strategy.release(i)?;
            }
        }
        let (loss, sums) = match fused_loss {
            Some(loss) => (loss, None),
            None => self.options.objective.loss_sum(&x, batch)?,
        };
        if let Some(sums) = sums {
            add_into(&mut self.sums.borrow_mut(), sums)?;
        }
        let loss = loss / global_loss_tokens as f64;
        let loss_value = loss.detach().f_to_kind(Kind::Double)?;
        // The load-balancing loss couples every sparse layer: its value, and the gradient each
        // layer's routing probabilities receive in backward (scaled as the loss is).
        let aux_grad = match (aux, &ctx.router_log) {
            (Some(a), Some(log)) => match log.with_all(|s| load_balancing(s, a.num_experts)) {
                Some((value, grad)) => {
                    let share = value.f_to_kind(Kind::Double)?.f_mul_scalar(a.share)?;
                    add_into(&mut self.aux_loss.borrow_mut(), share)?;
                    log_expert_counts(log);
                    Some(grad * (a.coef * a.share * self.options.loss_scale))
                }
                None => None,
            },
            _ => None,
        };
        let loss = if self.options.loss_scale != 1.0 {
            loss * self.options.loss_scale
        } else {
            loss
        };
        drop(x);

        // Backward.
        strategy.begin_backward();
        let mut grad_out: Option<Tensor> = None;
        for i in (0..n).rev() {
            let Saved { input, kept } = saved.pop().expect("one saved entry per unit");
            let (params, output) = match kept {
                Kept::Done(head_grads) => {
                    // The fused head: its gradients were computed with the loss.
                    let mut g = head_grads.into_iter();
                    grad_out = if i > 0 { g.next().flatten() } else { None };
                    self.finish_unit(strategy, i, g, grads, last)?;
                    continue;
                }
                Kept::Graph(params, output) => {
                    strategy.before_backward(model, i)?;
                    (params, output)
                }
                Kept::Recompute => {
                    let params = leaves(model, i, strategy.params_for(model, i)?);
                    let out = units[i].forward(&params, &input, &ctx);
                    (params, out)
                }
            };
            let (output, grad_out_ref) = if i + 1 == n {
                (loss.shallow_clone(), None)
            } else {
                (output, grad_out.as_ref())
            };
            let trainable = model.trainable_mask(i);
            let mut wrt: Vec<&Tensor> = Vec::with_capacity(params.len() + 1);
            if i > 0 {
                wrt.push(&input);
            }
            wrt.extend(
                params
                    .iter()
                    .zip(trainable)
                    .filter(|(_, t)| **t)
                    .map(|(p, _)| p),
            );
            // A sparse block's routing probabilities also receive the load-balancing loss's
            // gradient: differentiate `sum(output * grad_out) + sum(prob_sums * aux_grad)`.
            let routed = match (&aux_grad, &ctx.router_log, grad_out_ref) {
                (Some(g), Some(log), Some(go)) if i > 0 => log
                    .take(i - 1)
                    .map(|s| (&output * go).sum(Kind::Float) + (&s.prob_sums * g).sum(Kind::Float)),
                _ => None,
            };
            let mut g = if wrt.is_empty() {
                // A frozen first unit: nothing to differentiate.
                vec![].into_iter()
            } else if let Some(total) = &routed {
                vjp(total, None, &wrt)?.into_iter()
            } else {
                vjp(&output, grad_out_ref, &wrt)?.into_iter()
            };
            grad_out = if i > 0 { g.next().flatten() } else { None };
            self.finish_unit(strategy, i, g, grads, last)?;
        }
        strategy.finish_backward(last)?;
        Ok(loss_value)
    }

    /// Tokens per chunk of the fused head and loss for `batch`, or `None` when the loss takes
    /// the whole logits (DPO, or [`LossChunks::Whole`]).
    fn fused_head_rows(&self, batch: &Batch) -> Option<usize> {
        if self.options.objective != Objective::NextToken {
            return None;
        }
        let tokens = batch.labels.numel();
        match self.options.loss_chunks {
            LossChunks::Whole => None,
            LossChunks::Rows(rows) => Some(rows),
            LossChunks::Auto => Some(self.model.config().loss_chunk_rows(tokens)),
        }
    }

    /// The end of unit `unit`'s backward: its parameter gradients `g` (the trainable ones', in
    /// order) added into `grads` in fp32, its parameters released, and with `last` (or a
    /// strategy that reduces every micro-batch) the gradients of the parameters it owns handed
    /// to the strategy.
    fn finish_unit(
        &self,
        strategy: &mut dyn Strategy,
        unit: usize,
        g: impl Iterator<Item = Option<Tensor>>,
        grads: &mut Params,
        last: bool,
    ) -> Result<(), TrainError> {
        let model = self.model;
        let trained_names = model.units()[unit]
            .param_names()
            .iter()
            .zip(model.trainable_mask(unit))
            .filter(|(_, t)| **t)
            .map(|(n, _)| n);
        for (name, pg) in trained_names.zip(g) {
            let Some(pg) = pg else { continue };
            // Gradients accumulate in fp32 whatever the compute dtype. Adding into an fp32
            // accumulator and copying into a strategy's fp32 storage (DDP's buckets) convert
            // as they go, with the values an fp32 copy first would give: one pass over the
            // gradient, no fp32 temporary. A strategy that takes each micro-batch's gradients
            // over (FSDP, which copies them into its flat group in the reduce dtype) gets a
            // parameter's gradient as computed when nothing else adds to it (one reader).
            match grads.get(name) {
                Some(acc) => {
                    let _ = acc.shallow_clone().f_add_(&pg)?;
                }
                None => match strategy.gradient_storage(name)? {
                    Some(storage) => {
                        storage.shallow_clone().f_copy_(&pg)?;
                        grads.insert(name.clone(), storage);
                    }
                    None => {
                        let handed_over = strategy.takes_gradients()
                            && strategy.reduces_every_micro_batch()
                            && model.param_spec(name).is_some_and(|s| s.readers.len() == 1);
                        let pg = if pg.kind() == Kind::Float || handed_over {
                            pg
                        } else {
                            pg.f_to_kind(Kind::Float)?
                        };
                        grads.insert(name.clone(), pg)
                    }
                },
            }
        }
        strategy.release(unit)?;
        if last || strategy.reduces_every_micro_batch() {
            let mut owned = Params::new();
            for s in model.owned_params(unit) {
                if let Some(g) = grads.get(&s.name) {
                    owned.insert(s.name.clone(), g.shallow_clone());
                }
            }
            strategy.gradients_ready(unit, &owned)?;
            if strategy.takes_gradients() {
                for name in owned.names() {
                    grads.remove(name);
                }
            }
        }
        Ok(())
    }
}

/// Each sparse layer's assignments per expert, at debug level (one transfer per layer, only
/// when debug logging is on).
fn log_expert_counts(log: &RouterLog) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    log.with_all(|layers| {
        for (layer, s) in layers {
            let counts = Vec::<f32>::try_from(s.counts.to_device(tch::Device::Cpu))
                .unwrap_or_default()
                .iter()
                .map(|c| *c as u64)
                .collect::<Vec<_>>();
            tracing::debug!(layer, ?counts, "tokens per expert");
        }
    });
}

/// Runs `inputs` forward without gradients unit by unit: each unit's parameters are asked of
/// `params_for` once for all inputs (so sharded weights gather each group once), and
/// `on_logits` gets each input's output of the last unit as soon as it is computed.
/// `release(unit)` follows each unit. With `adapters_off` the LoRA adapters are skipped (the
/// base model's forward).
pub fn forward_by_unit(
    model: &CausalLm,
    inputs: &[TokenInput],
    adapters_off: bool,
    params_for: &mut dyn FnMut(usize) -> Result<Vec<Tensor>, TrainError>,
    release: &mut dyn FnMut(usize) -> Result<(), TrainError>,
    on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
) -> Result<Vec<Tensor>, TrainError> {
    let _guard = tch::no_grad_guard();
    let units = model.units();
    let n = units.len();
    let ctxs: Vec<_> = inputs
        .iter()
        .map(|x| {
            let mut ctx = eval_ctx(model, x);
            ctx.adapters_off = adapters_off;
            ctx
        })
        .collect();
    let mut xs: Vec<Option<Tensor>> = inputs.iter().map(|x| Some(x.ids.shallow_clone())).collect();
    for (u, unit) in units.iter().enumerate() {
        let params = params_for(u)?;
        for (i, slot) in xs.iter_mut().enumerate() {
            let x = slot.take().expect("each input is carried to the last unit");
            let y = unit.forward(&params, &x, &ctxs[i]);
            if u + 1 == n {
                on_logits(i, y)?;
            } else {
                *slot = Some(y);
            }
        }
        drop(params);
        release(u)?;
    }
    Ok(ctxs
        .iter()
        .filter_map(|c| eval_aux_loss(model, c))
        .collect())
}

/// The forward context of an evaluation input: a mixture whose load-balancing loss is on
/// (`output_router_logits`) records its routing, as transformers computes `aux_loss` in
/// evaluation too.
pub fn eval_ctx(model: &CausalLm, input: &TokenInput) -> ForwardCtx {
    let mut ctx = model.ctx_for_input(input);
    if model.config().aux_loss_coef().is_some() {
        ctx.router_log = Some(RouterLog::default());
    }
    ctx
}

/// The unscaled load-balancing loss of the forward `ctx` recorded ([`eval_ctx`]), if any: an
/// fp32 scalar on the device (read with the evaluation's other figures).
pub fn eval_aux_loss(model: &CausalLm, ctx: &ForwardCtx) -> Option<Tensor> {
    let log = ctx.router_log.as_ref()?;
    let experts = model.config().moe.as_ref()?.num_experts as i64;
    let (value, _) = log.with_all(|s| load_balancing(s, experts))?;
    Some(value)
}
