//! One file of a full checkpoint or of `final/` streamed from the weights of any strategy
//! ([`write_state_file`]): rank 0 writes the header first, then each group as it is gathered to
//! it ([`ParallelWeights::visit_full`]), so no rank holds more than a group beyond its shards.

use std::path::Path;

use tch::Tensor;

use crate::error::TrainError;
use crate::parallel::weights::{ParallelWeights, StatePart};
use crate::state::hf_shards::{hub_planned, ShardedWriter};
use crate::state::peft::PEFT_PREFIX;

/// The files of a full checkpoint's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFile {
    /// `model.safetensors`: the parameters, in this dtype (`None`: the master dtype).
    Model(Option<tch::Kind>),
    /// `optimizer.safetensors`: `step`, then every first moment, then every second.
    Optimizer,
    /// A LoRA job's `adapter_model.safetensors`: the trained parameters in fp32 under PEFT's
    /// names (`base_model.model.` before the Hugging Face name).
    Adapter,
}

impl StateFile {
    /// The file's name without `.safetensors` (the stem of its shards).
    pub fn stem(self) -> &'static str {
        match self {
            StateFile::Model(_) => "model",
            StateFile::Optimizer => "optimizer",
            StateFile::Adapter => "adapter_model",
        }
    }
}

/// Streams one file of a full checkpoint (or `final/`) from `weights` into `dir`, split into
/// shards of at most `max_shard_bytes` with an index as `save_pretrained` splits them (one file
/// under the limit: `model.safetensors`, ...). Collective; only `is_root` writes. A write error
/// on the root does not stop it taking part in the gathers (the other ranks would wait for
/// it); it is returned once they are done, and the unfinished files are removed.
pub fn write_state_file(
    weights: &dyn ParallelWeights,
    dir: &Path,
    file: StateFile,
    max_shard_bytes: u64,
    is_root: bool,
) -> Result<(), TrainError> {
    let (parts, kind): (&[StatePart], _) = match file {
        StateFile::Model(kind) => (&[StatePart::Params], kind),
        StateFile::Adapter => (&[StatePart::Params], Some(tch::Kind::Float)),
        StateFile::Optimizer => (&[StatePart::ExpAvg, StatePart::ExpAvgSq], None),
    };
    let prefix = match file {
        StateFile::Adapter => PEFT_PREFIX,
        _ => "",
    };
    let optimizer = file == StateFile::Optimizer;
    // A model file is a Hugging Face weights file: stacked experts are written per expert.
    let hub_layout = matches!(file, StateFile::Model(_));
    let mut failure: Option<TrainError> = None;
    let mut writer = None;
    if is_root {
        let mut order = vec![];
        if optimizer {
            order.push(("step".to_string(), tch::Kind::Int64, vec![]));
        }
        for &part in parts {
            for (name, shape, k) in weights.full_layout(part) {
                let kind = kind.unwrap_or(k);
                if hub_layout {
                    order.extend(hub_planned(&name, kind, &shape));
                } else {
                    order.push((format!("{prefix}{name}{}", part.suffix()), kind, shape));
                }
            }
        }
        match ShardedWriter::create(dir, file.stem(), order, max_shard_bytes) {
            Ok(mut w) => {
                if optimizer {
                    let step = Tensor::from(weights.optimizer_steps() as i64);
                    if let Err(e) = w.write("step", &step) {
                        failure = Some(e.into());
                    }
                }
                writer = Some(w);
            }
            Err(e) => failure = Some(e.into()),
        }
    }
    let mut write = |part: StatePart, name: &str, t: &Tensor| -> Result<(), TrainError> {
        match writer.as_mut() {
            Some(w) if hub_layout => Ok(w.write_param(name, t)?),
            Some(w) => Ok(w.write(&format!("{prefix}{name}{}", part.suffix()), t)?),
            None => Ok(()),
        }
    };
    // A root that could not start its files still takes part in the gathers.
    let visited = visit_on_root(weights, parts, is_root && failure.is_none(), &mut write);
    if let Some(e) = failure {
        return Err(e);
    }
    visited?;
    if let Some(w) = writer {
        w.finish()?;
    }
    Ok(())
}

/// Gives `sink` each full tensor of `parts` on the root, as the weights gather them. A
/// failure of the sink does not stop the root taking part in the gathers (the other ranks
/// would wait for it): the sink is not called again, and the failure is returned once every
/// gather is done. Collective.
pub fn visit_on_root(
    weights: &dyn ParallelWeights,
    parts: &[StatePart],
    is_root: bool,
    sink: &mut dyn FnMut(StatePart, &str, &Tensor) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let mut failure: Option<TrainError> = None;
    for &part in parts {
        let mut visit = |name: &str, t: &Tensor| -> Result<(), TrainError> {
            if failure.is_none() {
                if let Err(e) = sink(part, name, t) {
                    failure = Some(e);
                }
            }
            Ok(())
        };
        weights.visit_full(part, is_root.then_some(&mut visit as _))?;
    }
    failure.map_or(Ok(()), Err)
}
