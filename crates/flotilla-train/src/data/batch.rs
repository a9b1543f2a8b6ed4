//! Batches and the per-step loader: [`Batch`] (an `[M, T]` pair of `i64` tensors on a device,
//! made by one copy from the host: pinned and asynchronous to a GPU),
//! [`DataLoader`] (the global batch of each optimizer step, this rank's micro-batches of it, and
//! the global count of labelled tokens), and [`eval_batches`]. The split follows the order
//! contract in the [module docs](super).

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::dataset::{Dataset, Sample};
use super::error::{DataError, Result};
use super::sampler::{eval_rows, micro_batch_rows, rank_rows, Sampler, SamplerState};
use crate::model::layers::varlen::{host_bounds, SequenceBounds};
use crate::model::{PackedLayout, TokenInput};

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
    /// What collating learnt of `positions` on the host (their largest, the sequences'
    /// bounds), for the forward ([`TokenInput::layout`]).
    pub layout: Option<PackedLayout>,
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
        // Everything the micro-batch needs on the device, in one host buffer and one copy:
        // ids, labels and, for packed rows, positions and the sequences' bounds.
        let n = (m * t) as usize;
        let mut host = inputs;
        host.extend_from_slice(&labels);
        let mut layout = None;
        if packed {
            let (starts, max_len) = host_bounds(&positions, m as usize, t as usize);
            let max_position = positions.iter().copied().max().unwrap_or(0);
            host.extend_from_slice(&positions);
            host.extend(starts.iter().map(|&s| s as i64));
            layout = Some((starts.len(), max_len, max_position));
        }
        let flat = to_device_in_one_copy(&host, device)?;
        let rows = |k: usize| -> Result<Tensor> {
            Ok(flat.f_narrow(0, (k * n) as i64, n as i64)?.f_view([m, t])?)
        };
        let (positions, layout) = match layout {
            None => (None, None),
            Some((bounds, max_len, max_position)) => {
                let cumulative = flat
                    .f_narrow(0, (3 * n) as i64, bounds as i64)?
                    .f_to_kind(Kind::Int)?;
                let layout = PackedLayout {
                    max_position,
                    bounds: SequenceBounds {
                        cumulative,
                        max_len,
                    },
                };
                (Some(rows(2)?), Some(layout))
            }
        };
        Ok(Batch {
            input_ids: rows(0)?,
            labels: rows(1)?,
            positions,
            layout,
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
            layout: self.layout.as_ref().map(PackedLayout::shallow_clone),
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

/// `values` on `device` by one copy: to a GPU from pinned memory and without waiting (a copy
/// from pageable memory would wait for everything queued on the device first).
fn to_device_in_one_copy(values: &[i64], device: Device) -> Result<Tensor> {
    let host = Tensor::f_from_slice(values)?;
    Ok(match device {
        Device::Cpu => host,
        Device::Cuda(_) => {
            crate::cuda::pinned(&host)?.f_to_device_(device, Kind::Int64, true, false)?
        }
        other => host.f_to_device(other)?,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ids: &[i64], positions: Option<&[i64]>) -> Sample {
        Sample {
            input_ids: ids.to_vec(),
            labels: ids.iter().map(|i| i + 100).collect(),
            positions: positions.map(<[i64]>::to_vec),
            rejected: None,
        }
    }

    #[test]
    fn one_copy_holds_ids_labels_and_what_the_host_knows_of_packed_rows() {
        let samples = [
            sample(&[1, 2, 3, 4, 5, 6], Some(&[0, 1, 2, 0, 1, 2])),
            sample(&[7, 8, 9, 10, 11, 12], None),
            sample(&[13, 14, 15, 16, 17, 18], Some(&[0, 1, 0, 1, 2, 3])),
        ];
        let b = Batch::collate(&samples, Device::Cpu).unwrap();
        let ids: Vec<i64> = (1..=18).collect();
        assert_eq!(
            Vec::<i64>::try_from(b.input_ids.reshape([-1])).unwrap(),
            ids
        );
        let labels: Vec<i64> = ids.iter().map(|i| i + 100).collect();
        assert_eq!(
            Vec::<i64>::try_from(b.labels.reshape([-1])).unwrap(),
            labels
        );
        assert_eq!(b.input_ids.size(), [3, 6]);
        let positions = b.positions.as_ref().unwrap();
        let want = [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3];
        assert_eq!(Vec::<i64>::try_from(positions.reshape([-1])).unwrap(), want);
        // The host's layout is what a forward would otherwise read back from the device.
        let layout = b.layout.as_ref().unwrap();
        let read = SequenceBounds::of(positions);
        assert_eq!(layout.max_position, positions.max().int64_value(&[]));
        assert_eq!(layout.max_position, 5);
        assert_eq!(layout.bounds.max_len, read.max_len);
        assert_eq!(layout.bounds.cumulative.kind(), Kind::Int);
        assert_eq!(
            Vec::<i32>::try_from(&layout.bounds.cumulative).unwrap(),
            Vec::<i32>::try_from(&read.cumulative).unwrap()
        );
        assert_eq!(
            Vec::<i32>::try_from(&layout.bounds.cumulative).unwrap(),
            [0, 3, 6, 12, 14, 18]
        );
        assert_eq!(b.num_loss_tokens, 18);

        // Rows of one sequence each: no positions, no layout.
        let plain = Batch::collate(&samples[1..2], Device::Cpu).unwrap();
        assert!(plain.positions.is_none() && plain.layout.is_none());
        assert_eq!(
            Vec::<i64>::try_from(plain.labels.reshape([-1])).unwrap(),
            [107, 108, 109, 110, 111, 112]
        );
    }
}
