//! The single-process training loop: [`Trainer`] runs optimizer steps (data → unit engine →
//! gradient clipping → AdamW at the scheduled learning rate) and reports one [`StepMetrics`]
//! row per step, written to `metrics.csv` by [`MetricsWriter`]. Checkpoints, evaluation and run
//! directories live in `checkpoint.rs` and `run.rs`; DDP/FSDP come later. This file owns the
//! loop and the step-metrics format.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind};

use super::engine::{Engine, EngineOptions, SingleProcess};
use super::optim::{clip_grad_norm, AdamW, AdamWConfig};
use super::schedule::Schedule;
use super::TrainError;
use crate::config::schema::{self, Precision, TrainerConfig};
use crate::data::DataLoader;
use crate::model::{Llama, Params};

/// One row of `metrics.csv`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// 0-based optimizer step.
    pub step: u64,
    /// Mean loss over the labelled tokens of the global batch.
    pub loss: f64,
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used by this step.
    pub lr: f64,
    /// Input tokens (rows × seq_len, on this rank) per second of this step.
    pub tokens_per_s: f64,
    /// Seconds since the trainer was created, at the end of this step.
    pub elapsed_s: f64,
}

/// Appends [`StepMetrics`] rows to a CSV file (header first), flushing after each row.
pub struct MetricsWriter {
    writer: csv::Writer<std::fs::File>,
}

impl MetricsWriter {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, TrainError> {
        let file = std::fs::File::create(path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            writer: csv::Writer::from_writer(file),
        })
    }

    pub fn write(&mut self, row: &StepMetrics) -> Result<(), TrainError> {
        self.writer.serialize(row)?;
        self.writer.flush().map_err(|e| TrainError::Csv(e.into()))?;
        Ok(())
    }
}

/// The torch device of `trainer.device` (`auto`: CUDA when available).
pub fn torch_device(device: schema::Device) -> Device {
    match device {
        schema::Device::Cpu => Device::Cpu,
        schema::Device::Cuda => Device::Cuda(0),
        schema::Device::Auto => Device::cuda_if_available(),
    }
}

/// A single-process fp32 trainer over a data loader.
pub struct Trainer {
    pub(super) model: Llama,
    pub(super) params: Params,
    pub(super) optimizer: AdamW,
    pub(super) schedule: Schedule,
    pub(super) loader: DataLoader,
    pub(super) options: EngineOptions,
    pub(super) grad_clip: f64,
    pub(super) step: u64,
    pub(super) start: Instant,
}

impl Trainer {
    /// A trainer for `model` starting from `params` (copied to `device` in fp32). Only
    /// `precision: 32-true` is supported so far.
    pub fn new(
        model: Llama,
        params: &Params,
        config: &TrainerConfig,
        loader: DataLoader,
        device: Device,
    ) -> Result<Self, TrainError> {
        if config.precision != Precision::Full32 {
            return Err(TrainError::Unsupported(format!(
                "trainer.precision={:?} (only 32-true so far)",
                config.precision
            )));
        }
        model.check_params(params)?;
        Ok(Self {
            params: params.to(device, Kind::Float),
            model,
            optimizer: AdamW::new(AdamWConfig {
                betas: config.betas,
                eps: config.eps,
                weight_decay: config.weight_decay,
            }),
            schedule: Schedule {
                kind: config.schedule,
                lr: config.lr,
                min_lr: config.min_lr,
                warmup_steps: config.warmup_steps,
                max_steps: config.max_steps,
            },
            loader,
            options: EngineOptions {
                activation_checkpointing: config.activation_checkpointing,
            },
            grad_clip: config.grad_clip,
            step: 0,
            start: Instant::now(),
        })
    }

    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The current parameters (fp32, on the training device).
    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// Steps taken so far (the 0-based index of the next step).
    pub fn step_index(&self) -> u64 {
        self.step
    }

    /// One optimizer step.
    pub fn step(&mut self) -> Result<StepMetrics, TrainError> {
        let t0 = Instant::now();
        let batches = self.loader.next_step()?;
        let engine = Engine::new(&self.model, self.options);
        let mut strategy = SingleProcess {
            params: &self.params,
        };
        let (loss, grads) = engine.forward_backward(
            &mut strategy,
            &batches.micro_batches,
            batches.global_loss_tokens,
        )?;
        let grad_norm = clip_grad_norm(&grads, self.grad_clip)?;
        let lr = self.schedule.lr_at(self.step);
        self.optimizer.step(&self.params, &grads, lr)?;
        let tokens: i64 = batches
            .micro_batches
            .iter()
            .map(|b| b.input_ids.numel() as i64)
            .sum();
        let row = StepMetrics {
            step: self.step,
            loss,
            grad_norm,
            lr,
            tokens_per_s: tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
            elapsed_s: self.start.elapsed().as_secs_f64(),
        };
        self.step += 1;
        Ok(row)
    }

    /// Runs `steps` steps, writing each row to `metrics` when given; returns the rows.
    pub fn run(
        &mut self,
        steps: u64,
        mut metrics: Option<&mut MetricsWriter>,
    ) -> Result<Vec<StepMetrics>, TrainError> {
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
