//! Precomputed reference log-probabilities (`objective.reference: precomputed`): one pass of
//! the reference over every training and evaluation pair before the first step, kept in the
//! run directory (`reference_logps/train.f32`, `eval.f32`: each pair's chosen and rejected
//! sums, little-endian fp32, in sample order), so that no second model is held and a resumed
//! run reads them back instead of recomputing them from weights that have moved.

use std::path::{Path, PathBuf};

use crate::data::{eval_rows, Batch, Dataset};
use crate::error::TrainError;
use crate::parallel::tensor_comm::TensorCollectives;
use crate::trainer::{ReferenceLogps, Trainer};
use flotilla_comm::comm::ReduceOp;

/// The directory of the cached tables in a run directory.
pub const REFERENCE_DIR: &str = "reference_logps";

/// The reference's chosen and rejected log-probabilities of every pair of `dataset`
/// (`2 * index`, `2 * index + 1`), computed `micro` pairs at a time with each rank taking its
/// share (collective: every rank makes the same number of reference passes).
pub fn compute(
    trainer: &mut Trainer,
    dataset: &dyn Dataset,
    micro: usize,
) -> Result<Vec<f32>, TrainError> {
    let (rank, world) = trainer.rank_world();
    let n = dataset.len();
    let micro = micro.max(1);
    let mine: Vec<usize> = eval_rows(n, rank, world).collect();
    let rounds = (0..world)
        .map(|r| eval_rows(n, r, world).len().div_ceil(micro))
        .max()
        .unwrap_or(0);
    let mut table = vec![0f32; 2 * n];
    for round in 0..rounds {
        let chunk = &mine[(round * micro).min(mine.len())..((round + 1) * micro).min(mine.len())];
        let batches = if chunk.is_empty() {
            vec![]
        } else {
            let samples = chunk
                .iter()
                .map(|&i| dataset.get(i))
                .collect::<Result<Vec<_>, _>>()?;
            vec![Batch::collate(&samples, trainer.device())?]
        };
        let logps = trainer.reference_logps_of(&batches)?;
        if let Some(l) = logps.first() {
            let values: Vec<f32> = Vec::<f32>::try_from(l.to_device(tch::Device::Cpu))?;
            let m = chunk.len();
            for (k, &i) in chunk.iter().enumerate() {
                table[2 * i] = values[k];
                table[2 * i + 1] = values[m + k];
            }
        }
    }
    if let Some(comm) = trainer.comm() {
        table = comm.all_reduce_host(&table, ReduceOp::Sum)?;
    }
    Ok(table)
}

fn table_path(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(REFERENCE_DIR).join(format!("{name}.f32"))
}

/// The table `name` of `run_dir` when it is there and holds `pairs` pairs.
fn read(run_dir: &Path, name: &str, pairs: usize) -> Result<Option<Vec<f32>>, TrainError> {
    let path = table_path(run_dir, name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TrainError::BadState(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    if bytes.len() != pairs * 8 {
        return Err(TrainError::BadState(format!(
            "{} holds {} bytes, not the {} of {pairs} pairs: the data changed since the \
             reference was computed; start a new run (or delete {} to recompute it from the \
             starting weights)",
            path.display(),
            bytes.len(),
            pairs * 8,
            run_dir.join(REFERENCE_DIR).display()
        )));
    }
    Ok(Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    ))
}

fn write(run_dir: &Path, name: &str, table: &[f32]) -> Result<(), TrainError> {
    let dir = run_dir.join(REFERENCE_DIR);
    std::fs::create_dir_all(&dir)
        .map_err(|e| TrainError::BadState(format!("cannot create {}: {e}", dir.display())))?;
    let bytes: Vec<u8> = table.iter().flat_map(|v| v.to_le_bytes()).collect();
    crate::data::tokenizer::write_atomic(&table_path(run_dir, name), &bytes)?;
    Ok(())
}

/// The tables of `train` and `eval`: read from `run_dir` when a previous start of this run
/// wrote them, else computed from the trainer's current weights — which must be the starting
/// ones, so call it before a checkpoint is restored — and written there by rank 0.
pub fn load_or_compute(
    trainer: &mut Trainer,
    run_dir: &Path,
    train: &dyn Dataset,
    eval: Option<&dyn Dataset>,
    micro: usize,
) -> Result<ReferenceLogps, TrainError> {
    let is_root = trainer.rank_world().0 == 0;
    let mut table = |name: &str, data: &dyn Dataset| -> Result<Vec<f32>, TrainError> {
        // Every rank reads the same files, so every rank agrees on computing.
        if let Some(t) = read(run_dir, name, data.len())? {
            return Ok(t);
        }
        let t = compute(trainer, data, micro)?;
        if is_root {
            write(run_dir, name, &t)?;
        }
        Ok(t)
    };
    let train = table("train", train)?;
    let eval = eval.map(|e| table("eval", e)).transpose()?;
    Ok(ReferenceLogps { train, eval })
}
