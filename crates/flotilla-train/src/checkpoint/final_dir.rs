//! A job's `final/`, written once training ends: the trained model as a Hugging Face directory
//! ([`save_final`]), or a LoRA job's adapter in PEFT's format with, on request, the merged model
//! ([`save_adapter`]). Both are gathered to rank 0 a group at a time and are collective: a
//! failure on any rank fails them on every rank.

use std::path::Path;

use tch::Kind;

use super::state_file::{write_state_file, StateFile};
use super::{io, on_all_ranks};
use crate::error::TrainError;
use crate::model::CausalLm;
use crate::state::hf_weights::{save_hf_from, WEIGHTS_FILE};
use crate::state::peft::{
    adapter_config, MergedWeights, ADAPTER_CONFIG, ADAPTER_WEIGHTS, MERGED_DIR,
};
use crate::trainer::Trainer;
use flotilla_config::schema::LoraConfig;

/// Writes the trained model as a Hugging Face directory `dir` (fp32 `model.safetensors`,
/// `config.json`, and the tokenizer when there is one), gathered to rank 0 a group at a time.
/// Collective; a failure on any rank fails it on every rank.
pub fn save_final(
    trainer: &Trainer,
    dir: &Path,
    tokenizer: Option<&crate::data::Tokenizer>,
) -> Result<(), TrainError> {
    let root = trainer.rank_world().0 == 0;
    on_all_ranks(trainer, "set-up of final/", || {
        if root {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        Ok(())
    })?;
    on_all_ranks(trainer, "write of final/", || {
        let weights = dir.join(WEIGHTS_FILE);
        let file = StateFile::Model(Some(tch::Kind::Float));
        write_state_file(trainer.weights(), &weights, file, root)?;
        if root {
            crate::model::finish_hf_dir(dir, &trainer.model, tch::Kind::Float)?;
            if let Some(tok) = tokenizer {
                tok.save_into(dir)?;
            }
        }
        Ok(())
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
    tokenizer: Option<&crate::data::Tokenizer>,
) -> Result<(), TrainError> {
    let root = trainer.rank_world().0 == 0;
    on_all_ranks(trainer, "set-up of final/", || {
        if root {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        Ok(())
    })?;
    on_all_ranks(trainer, "write of final/", || {
        let weights = dir.join(ADAPTER_WEIGHTS);
        write_state_file(trainer.weights(), &weights, StateFile::Adapter, root)?;
        if root {
            let path = dir.join(ADAPTER_CONFIG);
            let mut text =
                serde_json::to_string_pretty(&adapter_config(lora, base)).expect("serialises");
            text.push('\n');
            std::fs::write(&path, text).map_err(io(&path))?;
            if let Some(tok) = tokenizer {
                tok.save_into(dir)?;
            }
        }
        Ok(())
    })?;
    if lora.merge {
        on_all_ranks(trainer, "write of final/merged/", || {
            let params = trainer.weights().full_params()?;
            if root {
                let merged_dir = dir.join(MERGED_DIR);
                let base_model = CausalLm::new(trainer.model.config())?;
                let merged = MergedWeights::new(&params, &trainer.model, lora);
                save_hf_from(&merged_dir, &base_model, &merged, Kind::Float)?;
                if let Some(tok) = tokenizer {
                    tok.save_into(&merged_dir)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}
