//! A job's `final/`, written once training ends: the trained model as a Hugging Face directory
//! ([`save_final`]), or a LoRA job's adapter in PEFT's format with, on request, the merged model
//! ([`save_adapter`]). Both are gathered to rank 0 a group at a time and are collective: a
//! failure on any rank fails them on every rank. Either is written into a hidden sibling and
//! renamed into place when whole (`write_whole`), so a `final/` that exists is complete.

use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use super::state_file::{visit_on_root, write_state_file, StateFile};
use super::{io, on_all_ranks};
use crate::data::Tokenizer;
use crate::error::TrainError;
use crate::model::hf_config::{read_hf_config, weight_kind};
use crate::model::CausalLm;
use crate::model::{finish_hf_dir, write_generation_config, SpecialIds};
use crate::parallel::weights::StatePart;
use crate::state::hf_weights::HfDirOptions;
use crate::state::merge::MergedStream;
use crate::state::peft::{adapter_config, ADAPTER_CONFIG, MERGED_DIR};
use crate::trainer::Trainer;
use flotilla_config::schema::{JobConfig, LoraConfig, Precision, SaveDtype};

/// Name prefix of a `final/` being written (`.tmp-final`), renamed into place when whole.
const STAGING_PREFIX: &str = ".tmp-";

/// Where `dir` is written before it is renamed into place: a hidden sibling.
fn staging_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(|| "final".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{STAGING_PREFIX}{name}"))
}

/// Writes `dir` whole or not at all: rank 0 creates a hidden staging sibling (removing one a
/// killed process left), every rank runs `write` into it, and rank 0 renames it into place,
/// replacing an older `dir`, once `write` succeeded everywhere; on failure rank 0 removes the
/// staging directory. A directory that exists is therefore complete: `status` and `report`
/// take `final/` as the sign that training finished. `write` gets the staging directory and
/// whether this rank is rank 0. Collective.
fn write_whole(
    trainer: &Trainer,
    dir: &Path,
    write: impl FnOnce(&Path, bool) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let root = trainer.rank_world().0 == 0;
    let staging = staging_dir(dir);
    on_all_ranks(trainer, "set-up of final/", || {
        if root {
            if staging.exists() {
                std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
            }
            std::fs::create_dir_all(&staging).map_err(io(&staging))?;
        }
        Ok(())
    })?;
    let written = write(&staging, root).and_then(|()| {
        on_all_ranks(trainer, "commit of final/", || {
            if root {
                if dir.exists() {
                    std::fs::remove_dir_all(dir).map_err(io(dir))?;
                }
                std::fs::rename(&staging, dir).map_err(io(dir))?;
            }
            Ok(())
        })
    });
    if written.is_err() && root {
        // Best effort: the error that matters is the one being returned.
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

/// How a job's `final/` is written: its weights' dtype, its largest weights file, and the base
/// the job fine-tuned (`model.init_from`), whose `config.json` and `generation_config.json` it
/// keeps.
#[derive(Clone, Copy, Debug)]
pub struct FinalOptions<'a> {
    pub kind: Kind,
    pub max_shard_bytes: u64,
    pub base: Option<&'a Path>,
}

impl<'a> FinalOptions<'a> {
    /// `final/` of `job`: `trainer.save_dtype` (`auto`: the base's dtype, else bfloat16 under
    /// the bf16 precisions and float32 otherwise), `trainer.max_shard_size`, and
    /// `model.init_from` as the base.
    pub fn for_job(job: &'a JobConfig) -> Result<Self, TrainError> {
        let base = job.model.init_from.as_deref().map(Path::new);
        let kind = match job.trainer.save_dtype.unwrap_or(SaveDtype::Auto) {
            SaveDtype::Float32 => Kind::Float,
            SaveDtype::Bfloat16 => Kind::BFloat16,
            SaveDtype::Float16 => Kind::Half,
            SaveDtype::Auto => {
                let declared = match base {
                    Some(b) => weight_kind(&read_hf_config(b)?),
                    None => None,
                };
                declared.unwrap_or(match job.precision() {
                    Precision::Bf16Mixed | Precision::Bf16True => Kind::BFloat16,
                    Precision::Full32 | Precision::Fp16Mixed | Precision::Auto => Kind::Float,
                })
            }
        };
        Ok(FinalOptions {
            kind,
            max_shard_bytes: job.trainer.max_shard_bytes(),
            base,
        })
    }

    fn hf_dir(&self, tokenizer: Option<&Tokenizer>) -> HfDirOptions<'_> {
        HfDirOptions {
            max_shard_bytes: Some(self.max_shard_bytes),
            base: self.base,
            special: special_ids(tokenizer),
        }
    }
}

/// The special-token ids of the job's tokenizer, for a `final/` without a base config.
fn special_ids(tokenizer: Option<&Tokenizer>) -> SpecialIds {
    match tokenizer {
        Some(t) => SpecialIds::of_tokens(t.bos_id(), t.eos_id(), t.pad_id()),
        None => SpecialIds::default(),
    }
}

/// Writes the trained model as a Hugging Face directory `dir` as `save_pretrained` writes one:
/// the weights in `opts.kind`, split into files of at most `opts.max_shard_bytes` with
/// `model.safetensors.index.json` when there is more than one, `config.json` and
/// `generation_config.json` (the base's, or built from the tokenizer's special tokens), and the
/// tokenizer's files. Gathered to rank 0 a group at a time and streamed to the files.
/// Collective; a failure on any rank fails it on every rank.
pub fn save_final(
    trainer: &Trainer,
    dir: &Path,
    tokenizer: Option<&Tokenizer>,
    opts: FinalOptions<'_>,
) -> Result<(), TrainError> {
    write_whole(trainer, dir, |dir, root| {
        on_all_ranks(trainer, "write of final/", || {
            let file = StateFile::Model(Some(opts.kind));
            write_state_file(trainer.weights(), dir, file, opts.max_shard_bytes, root)?;
            if root {
                let hf = opts.hf_dir(tokenizer);
                finish_hf_dir(dir, &trainer.model, opts.kind, hf.base, &hf.special)?;
                write_generation_config(dir, hf.base, &hf.special)?;
                if let Some(tok) = tokenizer {
                    tok.save_into(dir)?;
                }
            }
            Ok(())
        })
    })
}

/// Writes a LoRA job's `final/` as a PEFT adapter directory: the trained parameters (the
/// factors and modules to save, fp32) under PEFT's names, `adapter_config.json`, and the
/// tokenizer; with `lora.merge`, also `final/merged/`. Collective (the trained parameters are
/// gathered to rank 0); a failure on any rank fails it on every rank.
pub fn save_adapter(
    trainer: &Trainer,
    dir: &Path,
    lora: &LoraConfig,
    base: Option<&str>,
    tokenizer: Option<&Tokenizer>,
    merged: FinalOptions<'_>,
) -> Result<(), TrainError> {
    write_whole(trainer, dir, |dir, root| {
        on_all_ranks(trainer, "write of final/", || {
            write_state_file(trainer.weights(), dir, StateFile::Adapter, u64::MAX, root)?;
            if root {
                let path = dir.join(ADAPTER_CONFIG);
                let mut text = serde_json::to_string_pretty(&adapter_config(
                    lora,
                    trainer.model.config(),
                    base,
                ))
                .expect("serialises");
                text.push('\n');
                std::fs::write(&path, text).map_err(io(&path))?;
                if let Some(tok) = tokenizer {
                    tok.save_into(dir)?;
                }
            }
            Ok(())
        })?;
        if lora.merge {
            let merged_dir = dir.join(MERGED_DIR);
            on_all_ranks(trainer, "write of final/merged/", || {
                save_merged(trainer, &merged_dir, lora, tokenizer, merged, root)
            })?;
        }
        Ok(())
    })
}

/// Writes `final/merged/`: the adapters folded into the base, streamed unit by unit on the
/// root's host as the weights are gathered to it (each unit's base weights and factors, no
/// more), in `opts.kind`, with the files [`save_final`] writes besides the weights.
/// Collective; only `root` writes.
fn save_merged(
    trainer: &Trainer,
    dir: &Path,
    lora: &LoraConfig,
    tokenizer: Option<&Tokenizer>,
    opts: FinalOptions<'_>,
    root: bool,
) -> Result<(), TrainError> {
    let mut stream = None;
    let mut failure = None;
    if root {
        let started = std::fs::create_dir_all(dir)
            .map_err(io(dir))
            .and_then(|()| {
                MergedStream::create(dir, &trainer.model, lora, opts.kind, opts.max_shard_bytes)
            });
        match started {
            Ok(s) => stream = Some(s),
            Err(e) => failure = Some(e),
        }
    }
    let mut take = |_: StatePart, name: &str, t: &Tensor| match stream.as_mut() {
        Some(s) => s.take(name, t),
        None => Ok(()),
    };
    // A root that could not start its files still takes part in the gathers.
    let sink = root && failure.is_none();
    let visited = visit_on_root(trainer.weights(), &[StatePart::Model], sink, &mut take);
    if let Some(e) = failure {
        return Err(e);
    }
    visited?;
    if let Some(stream) = stream {
        stream.finish()?;
        let base_model = CausalLm::new(trainer.model.config())?;
        let hf = opts.hf_dir(tokenizer);
        finish_hf_dir(dir, &base_model, opts.kind, hf.base, &hf.special)?;
        write_generation_config(dir, hf.base, &hf.special)?;
        if let Some(tok) = tokenizer {
            tok.save_into(dir)?;
        }
    }
    Ok(())
}
