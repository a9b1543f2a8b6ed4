//! Batches and the per-step loader: [`Batch`] (an `[M, T]` pair of `i64` tensors on a device),
//! [`DataLoader`] (the global batch of each optimizer step, this rank's micro-batches of it, and
//! the global count of labelled tokens), and [`eval_batches`]. The split follows the order
//! contract in the [module docs](super).

use std::sync::Arc;

use tch::{Device, Tensor};

use super::dataset::{Dataset, Sample};
use super::error::{DataError, Result};
use super::sampler::{eval_rows, micro_batch_rows, rank_rows, Sampler, SamplerState};
use crate::model::TokenInput;

/// One micro-batch.
#[derive(Debug)]
pub struct Batch {
    /// `[M, T]` int64 input ids.
    pub input_ids: Tensor,
    /// `[M, T]` int64 targets of each position (already shifted: `labels[:, t]` is the token
    /// that should follow `input_ids[:, ..=t]`), [`IGNORE_INDEX`](super::IGNORE_INDEX) where there is no loss.
    pub labels: Tensor,
    /// `[M, T]` int64 position ids when a row packs several sequences that must not see each
    /// other (see [`Sample::positions`]); rows that do not are `0..T`. `None` when no row does.
    pub positions: Option<Tensor>,
    /// Labels other than [`IGNORE_INDEX`](super::IGNORE_INDEX) in this micro-batch.
    pub num_loss_tokens: u64,
    /// Preference pairs: the `M` pairs' chosen sequences are rows `0..M`, their rejected ones
    /// rows `M..2M` (`input_ids` is `[2M, T]`).
    pub pairs: bool,
    /// Preference pairs: the reference model's summed completion log-probabilities of each
    /// row (`[2M]`, fp32), once the trainer has computed or looked them up.
    pub reference_logps: Option<Tensor>,
}

impl Batch {
    /// Stacks samples of equal length into a batch on `device`; preference pairs become their
    /// chosen rows then their rejected rows.
    pub fn collate(samples: &[Sample], device: Device) -> Result<Batch> {
        let pairs = samples.iter().any(|s| s.rejected.is_some());
        if pairs {
            let mut rows: Vec<Sample> = Vec::with_capacity(2 * samples.len());
            for s in samples {
                rows.push(Sample {
                    rejected: None,
                    ..s.clone()
                });
            }
            for s in samples {
                let Some(r) = &s.rejected else {
                    return Err(DataError::BatchSplit(
                        "a preference pair and a plain sample in one batch".into(),
                    ));
                };
                rows.push((**r).clone());
            }
            let mut batch = Self::collate(&rows, device)?;
            batch.pairs = true;
            return Ok(batch);
        }
        let m = samples.len() as i64;
        let t = samples.first().map_or(0, |s| s.input_ids.len()) as i64;
        let mut inputs = Vec::with_capacity((m * t) as usize);
        let mut labels = Vec::with_capacity((m * t) as usize);
        let packed = samples.iter().any(|s| s.positions.is_some());
        let mut positions = Vec::with_capacity(if packed { (m * t) as usize } else { 0 });
        let mut count = 0u64;
        for s in samples {
            let lengths = [
                Some(s.input_ids.len()),
                Some(s.labels.len()),
                s.positions.as_ref().map(Vec::len),
            ];
            if let Some(other) = lengths.into_iter().flatten().find(|&n| n as i64 != t) {
                return Err(DataError::BatchSplit(format!(
                    "samples of different lengths in one batch ({other} and {t})"
                )));
            }
            inputs.extend_from_slice(&s.input_ids);
            labels.extend_from_slice(&s.labels);
            if packed {
                match &s.positions {
                    Some(p) => positions.extend_from_slice(p),
                    None => positions.extend(0..t),
                }
            }
            count += s.num_loss_tokens() as u64;
        }
        let to = |v: &[i64]| -> Result<Tensor> {
            Ok(Tensor::f_from_slice(v)?
                .f_reshape([m, t])?
                .f_to_device(device)?)
        };
        Ok(Batch {
            input_ids: to(&inputs)?,
            labels: to(&labels)?,
            positions: if packed { Some(to(&positions)?) } else { None },
            num_loss_tokens: count,
            pairs: false,
            reference_logps: None,
        })
    }

    /// The model's input: the ids and, for packed rows, their positions.
    pub fn model_input(&self) -> TokenInput {
        TokenInput {
            ids: self.input_ids.shallow_clone(),
            positions: self.positions.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// Rows in the batch (`M`, or `2M` for `M` preference pairs).
    pub fn rows(&self) -> i64 {
        self.input_ids.size()[0]
    }

    /// Samples in the batch: rows, or pairs.
    pub fn samples(&self) -> i64 {
        if self.pairs {
            self.rows() / 2
        } else {
            self.rows()
        }
    }
}

/// The data of one optimizer step on one rank.
#[derive(Debug)]
pub struct StepBatches {
    /// This rank's micro-batches, in order.
    pub micro_batches: Vec<Batch>,
    /// Labelled tokens in the whole global batch (all ranks, all micro-batches): the loss
    /// normaliser, the same on every rank.
    pub global_loss_tokens: u64,
    /// Samples in the whole global batch (all ranks, all micro-batches): a preference
    /// objective's normaliser, its pairs.
    pub global_samples: u64,
    /// Sample indices of this rank's rows, in order (for logs and tests).
    pub indices: Vec<usize>,
}

impl StepBatches {
    /// Labelled tokens in this rank's micro-batches.
    pub fn local_loss_tokens(&self) -> u64 {
        self.micro_batches.iter().map(|b| b.num_loss_tokens).sum()
    }
}

/// How a global batch is laid out over ranks and micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLayout {
    /// `G`: samples per optimizer step over all ranks.
    pub global_batch_size: usize,
    /// `M`: samples per forward/backward on one rank.
    pub micro_batch_size: usize,
    pub rank: usize,
    pub world_size: usize,
}

impl BatchLayout {
    /// Checks that `G` splits into `W` shares of whole micro-batches.
    pub fn check(&self) -> Result<()> {
        let rows = rank_rows(self.global_batch_size, self.rank, self.world_size)?;
        micro_batch_rows(rows, self.micro_batch_size)?;
        Ok(())
    }
}

fn load(dataset: &dyn Dataset, indices: &[usize], device: Device) -> Result<Batch> {
    let samples = indices
        .iter()
        .map(|&i| dataset.get(i))
        .collect::<Result<Vec<_>>>()?;
    Batch::collate(&samples, device)
}

/// Walks a dataset one global batch per optimizer step and hands this rank its micro-batches.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    sampler: Sampler,
    layout: BatchLayout,
    device: Device,
}

impl DataLoader {
    /// A loader over `dataset`, shuffled per epoch with `seed` when `shuffle` is true.
    pub fn new(
        dataset: Arc<dyn Dataset>,
        shuffle: bool,
        seed: u64,
        layout: BatchLayout,
        device: Device,
    ) -> Result<Self> {
        layout.check()?;
        let sampler = Sampler::new(dataset.len(), shuffle, seed)?;
        Ok(DataLoader {
            dataset,
            sampler,
            layout,
            device,
        })
    }

    /// The next step's micro-batches for this rank; advances by one global batch.
    pub fn next_step(&mut self) -> Result<StepBatches> {
        let g = self.layout.global_batch_size;
        let global = self.sampler.next_indices(g);
        let mut global_loss_tokens = 0u64;
        for &i in &global {
            global_loss_tokens += self.dataset.num_loss_tokens(i)? as u64;
        }
        let rows = rank_rows(g, self.layout.rank, self.layout.world_size)?;
        let mut micro_batches = vec![];
        for r in micro_batch_rows(rows.clone(), self.layout.micro_batch_size)? {
            micro_batches.push(load(self.dataset.as_ref(), &global[r], self.device)?);
        }
        Ok(StepBatches {
            micro_batches,
            global_loss_tokens,
            global_samples: g as u64,
            indices: global[rows].to_vec(),
        })
    }

    /// The position in the data, for a checkpoint.
    pub fn state(&self) -> SamplerState {
        self.sampler.state()
    }

    /// Resumes from a checkpointed position.
    pub fn restore(&mut self, state: &SamplerState) -> Result<()> {
        self.sampler.restore(state)
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }
}

/// The evaluation batches of this rank: the first `num_samples` samples of `dataset` (at most
/// all of them) in order, rank `r` of `W` rows `r*E/W .. (r+1)*E/W`, in micro-batches of at most
/// `micro_batch_size` rows. `global_loss_tokens` counts all `E` samples.
pub fn eval_batches(
    dataset: &dyn Dataset,
    num_samples: usize,
    micro_batch_size: usize,
    rank: usize,
    world_size: usize,
    device: Device,
) -> Result<StepBatches> {
    let total = num_samples.min(dataset.len());
    let mut global_loss_tokens = 0u64;
    for i in 0..total {
        global_loss_tokens += dataset.num_loss_tokens(i)? as u64;
    }
    let rows = eval_rows(total, rank, world_size);
    let indices: Vec<usize> = rows.collect();
    let mut micro_batches = vec![];
    for chunk in indices.chunks(micro_batch_size.max(1)) {
        micro_batches.push(load(dataset, chunk, device)?);
    }
    Ok(StepBatches {
        micro_batches,
        global_loss_tokens,
        global_samples: total as u64,
        indices,
    })
}
