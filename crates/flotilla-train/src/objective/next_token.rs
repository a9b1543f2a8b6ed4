//! Next-token cross-entropy over a batch whose labels are already the next tokens (the data
//! pipeline shifts them: `labels[:, t]` follows `input_ids[:, ..=t]`), ignoring
//! [`IGNORE_INDEX`] positions (prompts, padding, the turns a chat job does not train on).
//!
//! `model::causal_lm_loss*` follow the Hugging Face convention instead (labels aligned with the
//! inputs, shifted inside the loss) and must not be used with a batch's labels.

use tch::{Kind, Reduction, Tensor};

use crate::data::{Batch, IGNORE_INDEX};

/// The summed cross-entropy (fp32) of `logits` `[M, T, V]` against `batch`'s labels, with no
/// shift. Divide by [`StepBatches::global_loss_tokens`](crate::data::StepBatches) for the step's
/// mean loss.
pub fn next_token_loss_sum(logits: &Tensor, batch: &Batch) -> Tensor {
    let v = *logits.size().last().expect("logits [M, T, V]");
    logits
        .to_kind(Kind::Float)
        .reshape([-1, v])
        .cross_entropy_loss::<&Tensor>(
            &batch.labels.reshape([-1]),
            None,
            Reduction::Sum,
            IGNORE_INDEX,
            0.0,
        )
}
