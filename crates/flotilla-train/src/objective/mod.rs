//! The objective: what turns a forward's logits and a batch into the loss the engine
//! differentiates and the trainer reports. [`next_token`] is next-token cross-entropy, the loss
//! of supervised fine-tuning and pre-training, normalised by the global batch's labelled
//! tokens; [`dpo`] is direct preference optimisation over pairs, normalised by the global
//! batch's pairs. [`Objective`] chooses between them from the job's `objective`.
//! [`fused_head`] computes next-token cross-entropy with the model's head a chunk of tokens at
//! a time, with its gradients, so that the whole logits are never alive.

pub mod dpo;
pub mod fused_head;
pub mod next_token;

pub use dpo::{sequence_logps, Dpo, DpoSums, DPO_METRICS};
pub use next_token::next_token_loss_sum;

use tch::Tensor;

/// The metrics column of a mixture of experts' load-balancing loss (unscaled by
/// `router_aux_loss_coef`; the step's mean over micro-batches and ranks), when it is on.
pub const AUX_LOSS_METRIC: &str = "aux_loss";

use crate::data::Batch;
use flotilla_config::schema::ObjectiveConfig;

/// What the engine minimises.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Objective {
    /// Next-token cross-entropy.
    #[default]
    NextToken,
    /// DPO over preference pairs.
    Dpo(Dpo),
}

impl Objective {
    pub fn of(config: &ObjectiveConfig) -> Self {
        match config {
            ObjectiveConfig::Sft => Objective::NextToken,
            ObjectiveConfig::Dpo(d) => Objective::Dpo(Dpo::from(d)),
        }
    }

    /// The micro-batch's summed loss (the engine divides it by the step's normaliser) and,
    /// for DPO, its pairs' sums ([`DpoSums::to_vec`]'s order, on the device, not read).
    pub fn loss_sum(
        &self,
        logits: &Tensor,
        batch: &Batch,
    ) -> Result<(Tensor, Option<Tensor>), tch::TchError> {
        match self {
            Objective::NextToken => Ok((next_token_loss_sum(logits, batch), None)),
            Objective::Dpo(d) => {
                let (loss, sums) = d.loss_sum(logits, batch)?;
                Ok((loss, Some(sums)))
            }
        }
    }

    /// What a step's summed loss is divided by: the global batch's labelled tokens, or its
    /// pairs.
    pub fn normaliser(&self, global_loss_tokens: u64, global_samples: u64) -> u64 {
        match self {
            Objective::NextToken => global_loss_tokens,
            Objective::Dpo(_) => global_samples,
        }
    }

    pub fn is_preference(&self) -> bool {
        matches!(self, Objective::Dpo(_))
    }
}
