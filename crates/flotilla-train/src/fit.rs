//! A training run in a run directory: [`fit`] steps a [`Trainer`] up to a step count,
//! evaluating every `eval_every` steps and at the end ([`Trainer::evaluate`]: loss, perplexity
//! and, for arithmetic data, greedy exact match), checkpointing every `checkpoint_every` steps
//! and at the end, and appending a [`MetricsRow`] per step to `metrics.csv` with the
//! [`MetricsWriter`] of the run (which drops rows a resumed run is about to redo). [`resume`]
//! applies `trainer.resume`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tch::{Kind, Tensor};

use crate::checkpoint::{self, TrainerState};
use crate::data::{eval_batches, greedy_generate_in_step, ArithmeticTask, Batch, Dataset};
use crate::error::TrainError;
use crate::host_memory::HostPhase;
use crate::model::TokenInput;
use crate::objective::next_token::next_token_loss_sum_chunked;
use crate::objective::{Dpo, DpoSums, Objective, AUX_LOSS_METRIC};
use crate::parallel::readings::{add_into, read_together};
use crate::parallel::tensor_comm::TensorCollectives;
use crate::preempt;
use crate::trainer::Trainer;
use flotilla_comm::comm::ReduceOp;
use flotilla_config::schema::Resume;
use flotilla_contract::metrics::{EvalMetrics, MetricsRow, MetricsWriter};

/// What to evaluate on.
#[derive(Clone)]
pub struct EvalSet<'a> {
    pub dataset: Arc<dyn Dataset>,
    /// Micro-batches per evaluation (`trainer.eval_batches`).
    pub num_batches: usize,
    pub micro_batch_size: usize,
    /// Arithmetic problems for exact match, with the number of held-out problems to use.
    pub task: Option<(&'a ArithmeticTask, usize)>,
}

/// Prompts per generation batch of the exact-match evaluation.
const EXACT_MATCH_BATCH: usize = 128;

impl Trainer {
    /// Evaluates the current parameters (no gradients, no state change). Collective in a
    /// distributed run: each rank takes its share of the evaluation samples and of the
    /// exact-match problems, runs them through its weights' [`ParallelWeights::forward_eval`]
    /// (under FSDP a group gathered at a time, every rank in step), and the sums are
    /// all-reduced, so every rank returns the same figures.
    ///
    /// [`ParallelWeights::forward_eval`]: crate::parallel::weights::ParallelWeights::forward_eval
    pub fn evaluate(&mut self, eval: &EvalSet<'_>) -> Result<EvalMetrics, TrainError> {
        if let Objective::Dpo(dpo) = self.objective() {
            return self.evaluate_pairs(eval, dpo);
        }
        let device = self.device;
        let (rank, world) = self.rank_world();
        let comm = self.comm().cloned();
        let n = eval.num_batches * eval.micro_batch_size;
        let batches = eval_batches(
            eval.dataset.as_ref(),
            n,
            eval.micro_batch_size,
            rank,
            world,
            device,
        )?;
        let inputs: Vec<TokenInput> = batches
            .micro_batches
            .iter()
            .map(Batch::model_input)
            .collect();
        // Each micro-batch's summed loss, added on the device in f64 and read once.
        let mut sum: Option<Tensor> = None;
        let (model, weights) = (&self.model, &mut self.weights);
        // A mixture with its load-balancing loss on: each micro-batch's (unscaled), as
        // training's `aux_loss` column; eval_loss stays the cross-entropy, as `loss` does.
        let aux = weights.forward_eval(model, &inputs, &mut |i, logits| {
            let batch = &batches.micro_batches[i];
            let rows = model.config().loss_chunk_rows(batch.labels.numel());
            let loss =
                next_token_loss_sum_chunked(&logits, batch, rows)?.f_to_kind(Kind::Double)?;
            add_into(&mut sum, loss)?;
            Ok(())
        })?;
        // The micro-batches' load-balancing losses summed on the device too: one read for both.
        let mut aux_sum: Option<Tensor> = None;
        for a in &aux {
            add_into(&mut aux_sum, a.f_to_kind(Kind::Double)?)?;
        }
        let figures: Vec<&Tensor> = sum.iter().chain(&aux_sum).collect();
        let mut read = read_together(&figures)?.into_iter();
        let mut next = || read.next().expect("a value for every figure");
        let mut sum = sum.map_or(0.0, |_| next());
        let aux_total = aux_sum.map_or(0.0, |_| next());
        let aux_on = model.config().aux_loss_coef().is_some();
        let mut aux_sums = (aux_total, aux.len() as f64);
        drop(inputs);
        let mut correct_total = None;
        if let Some((task, max)) = eval.task {
            if !task.eval.is_empty() {
                let all = &task.eval[..max.min(task.eval.len())];
                let share = |r: usize| &all[r * all.len() / world..(r + 1) * all.len() / world];
                let mine = share(rank);
                // Every rank runs as many generation batches as the rank with the most.
                let rounds = (0..world)
                    .map(|r| share(r).len().div_ceil(EXACT_MATCH_BATCH))
                    .max()
                    .unwrap_or(0);
                let agree = |active: bool| -> Result<bool, TrainError> {
                    let Some(comm) = &comm else { return Ok(active) };
                    let flag = comm.all_reduce_host(&[active as i64], ReduceOp::Max)?;
                    Ok(flag[0] != 0)
                };
                let mut generate = |prompts: &[Vec<i64>], max_new: usize| {
                    greedy_generate_in_step(
                        prompts,
                        max_new,
                        crate::data::arithmetic::EOS_ID as i64,
                        device,
                        |x| -> Result<Option<Tensor>, TrainError> {
                            let inputs: Vec<TokenInput> = x
                                .iter()
                                .map(|x| TokenInput::new(x.shallow_clone()))
                                .collect();
                            let mut out = None;
                            weights.forward_eval(model, &inputs, &mut |_, logits| {
                                out = Some(logits);
                                Ok(())
                            })?;
                            Ok(out)
                        },
                        agree,
                    )
                };
                let mut done = 0;
                let acc = task.exact_match(mine, EXACT_MATCH_BATCH, |prompts, max_new| {
                    done += 1;
                    generate(prompts, max_new)
                })?;
                for _ in done..rounds {
                    generate(&[], task.max_new_tokens())?;
                }
                correct_total = Some((acc.correct as f64, acc.total as f64));
            }
        }
        if let Some(comm) = &comm {
            let (c, t) = correct_total.unwrap_or((0.0, 0.0));
            let v = comm.all_reduce_host(
                &[
                    sum as f32,
                    c as f32,
                    t as f32,
                    aux_sums.0 as f32,
                    aux_sums.1 as f32,
                ],
                ReduceOp::Sum,
            )?;
            sum = v[0] as f64;
            if correct_total.is_some() {
                correct_total = Some((v[1] as f64, v[2] as f64));
            }
            aux_sums = (v[3] as f64, v[4] as f64);
        }
        let loss = sum / (batches.global_loss_tokens.max(1) as f64);
        let acc = correct_total.map(|(c, t)| if t > 0.0 { c / t } else { 0.0 });
        // The mean over the evaluation's micro-batches, as training averages its micro-batches'.
        let extra = match aux_on {
            true => vec![(
                AUX_LOSS_METRIC.to_string(),
                aux_sums.0 / aux_sums.1.max(1.0),
            )],
            false => vec![],
        };
        Ok(EvalMetrics {
            loss,
            ppl: Some(loss.exp()),
            acc,
            extra,
        })
    }

    /// [`Trainer::evaluate`] of a preference objective: its loss over the evaluation pairs
    /// and the means TRL logs (`rewards/*`, ...), the reference's log-probabilities looked up
    /// or computed as in training.
    fn evaluate_pairs(&mut self, eval: &EvalSet<'_>, dpo: Dpo) -> Result<EvalMetrics, TrainError> {
        let (rank, world) = self.rank_world();
        let n = eval.num_batches * eval.micro_batch_size;
        let mut batches = eval_batches(
            eval.dataset.as_ref(),
            n,
            eval.micro_batch_size,
            rank,
            world,
            self.device,
        )?;
        let table = self.reference_logps.as_ref().and_then(|t| t.eval.clone());
        self.attach_reference(&mut batches, table.as_deref())?;
        let inputs: Vec<TokenInput> = batches
            .micro_batches
            .iter()
            .map(Batch::model_input)
            .collect();
        // The loss and sums of every micro-batch, on the device, read once.
        let mut totals: Option<Tensor> = None;
        let (model, weights) = (&self.model, &mut self.weights);
        weights.forward_eval(model, &inputs, &mut |i, logits| {
            let (loss, s) = dpo.loss_sum(&logits, &batches.micro_batches[i])?;
            let these = Tensor::f_cat(&[loss.f_to_kind(Kind::Double)?.f_reshape([1])?, s], 0)?;
            add_into(&mut totals, these)?;
            Ok(())
        })?;
        let (mut loss_sum, mut sums) = match &totals {
            Some(t) => {
                let v = read_together(&[t])?;
                (v[0], DpoSums::from_slice(&v[1..]))
            }
            None => (0.0, DpoSums::default()),
        };
        if let Some(comm) = self.comm() {
            let mut values = vec![loss_sum as f32];
            values.extend(sums.to_vec().iter().map(|&x| x as f32));
            let v = comm.all_reduce_host(&values, ReduceOp::Sum)?;
            loss_sum = v[0] as f64;
            sums = DpoSums::from_slice(&v[1..].iter().map(|&x| x as f64).collect::<Vec<_>>());
        }
        Ok(EvalMetrics {
            loss: loss_sum / batches.global_samples.max(1) as f64,
            ppl: None,
            acc: None,
            extra: sums
                .metrics()
                .into_iter()
                .map(|(name, v)| (name.to_string(), v))
                .collect(),
        })
    }
}

/// Applies `trainer.resume`: `auto` restores the newest complete checkpoint of `run_dir` that
/// is whole (if any; a damaged one is skipped, [`checkpoint::newest_intact`]), `never` none, a
/// path that checkpoint. Returns the checkpoint used.
pub fn resume(
    trainer: &mut Trainer,
    run_dir: &Path,
    resume: &Resume,
) -> Result<Option<(PathBuf, TrainerState)>, TrainError> {
    let dir = match resume {
        Resume::Never => None,
        Resume::Auto => checkpoint::newest_intact(trainer, run_dir)?,
        Resume::Path(p) => {
            let dir = PathBuf::from(p);
            // (a directory that is not there is named by the restore)
            let checked = match dir.is_dir() {
                true => checkpoint::manifest::verify(&dir),
                false => Ok(()),
            };
            checked.map_err(|damage| {
                TrainError::BadState(format!(
                    "trainer.resume: checkpoint {} is damaged ({damage}); name an intact one, or \
                     set trainer.resume=auto to take the newest intact checkpoint",
                    dir.display()
                ))
            })?;
            Some(dir)
        }
    };
    match dir {
        Some(d) => {
            trainer.host.begin();
            let state = checkpoint::restore(trainer, &d)?;
            trainer.host.end(HostPhase::Resume);
            Ok(Some((d, state)))
        }
        None => Ok(None),
    }
}

/// What [`fit`] does besides stepping.
pub struct FitOptions<'a> {
    pub run_dir: &'a Path,
    /// Step count to reach (`trainer.max_steps`, or fewer to stop early).
    pub until: u64,
    /// Steps between evaluations (0: none); also evaluates at `max_steps`.
    pub eval_every: u64,
    pub eval: Option<EvalSet<'a>>,
    /// 0: checkpoint only at the end.
    pub checkpoint_every: u64,
    pub keep_last_checkpoints: usize,
    /// Called with each row after it is written.
    pub on_row: Option<&'a mut dyn FnMut(&MetricsRow)>,
}

/// Steps `trainer` from its current step to `opts.until`, writing rows to `metrics` (rank 0's), evaluating
/// (also at `max_steps`) and checkpointing (also at `until`) as configured. With `eval_every == 0`, no
/// evaluation runs. Returns the rows of this call. Installs the [`preempt`] handlers; when a
/// stop is requested, checkpoints after the step in progress and returns
/// [`preempt::PreemptError::Stopped`].
pub fn fit(
    trainer: &mut Trainer,
    mut metrics: Option<&mut MetricsWriter>,
    mut opts: FitOptions<'_>,
) -> Result<Vec<MetricsRow>, TrainError> {
    preempt::install()?;
    let mut rows = vec![];
    while trainer.step_index() < opts.until {
        let step = trainer.step()?;
        let done = trainer.step_index();
        let last = done == opts.until;
        let at_end = done == trainer.schedule.max_steps;
        let eval = match &opts.eval {
            Some(set)
                if opts.eval_every > 0 && (at_end || done.is_multiple_of(opts.eval_every)) =>
            {
                trainer.host.begin();
                let metrics = trainer.evaluate(set)?;
                trainer.host.end(HostPhase::Evaluation);
                Some(metrics)
            }
            _ => None,
        };
        let row = step.with_eval(eval);
        if let Some(m) = metrics.as_deref_mut() {
            m.write(&row)?;
        }
        let mut saved = None;
        if last || (opts.checkpoint_every > 0 && done.is_multiple_of(opts.checkpoint_every)) {
            trainer.host.begin();
            saved = Some(checkpoint::save(
                trainer,
                opts.run_dir,
                opts.keep_last_checkpoints,
            )?);
            trainer.host.end(HostPhase::Checkpoint);
        }
        if let Some(f) = opts.on_row.as_deref_mut() {
            f(&row);
        }
        rows.push(row);
        // A stop request (SIGUSR2/SIGTERM) ends the run here, with a checkpoint at this step.
        // In a distributed run the ranks agreed on the flag during the step.
        if !last && trainer.stop_requested() {
            let checkpoint = match saved {
                Some(dir) => dir,
                None => checkpoint::save(trainer, opts.run_dir, opts.keep_last_checkpoints)?,
            };
            return Err(preempt::PreemptError::Stopped {
                reason: preempt::reason().to_string(),
                step: done,
                checkpoint,
            }
            .into());
        }
    }
    Ok(rows)
}
