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
    rows_loss_sum(&logits.reshape([-1, v]), &batch.labels.reshape([-1]))
        .expect("logits and labels of one batch")
}

/// The summed fp32 cross-entropy of logit rows `[N, V]` (any float dtype) against their
/// targets `[N]`, [`IGNORE_INDEX`] rows left out: the one formula of the whole, chunked and
/// fused paths.
pub fn rows_loss_sum(logits: &Tensor, labels: &Tensor) -> Result<Tensor, tch::TchError> {
    logits
        .f_to_kind(Kind::Float)?
        .f_cross_entropy_loss::<&Tensor>(labels, None, Reduction::Sum, IGNORE_INDEX, 0.0)
}

/// [`next_token_loss_sum`] without gradients, `rows` tokens at a time: only one chunk's fp32
/// log-probabilities are alive beside the logits (evaluation's peak). Equal to the whole sum up
/// to the order of the additions.
pub fn next_token_loss_sum_chunked(
    logits: &Tensor,
    batch: &Batch,
    rows: usize,
) -> Result<Tensor, tch::TchError> {
    let _guard = tch::no_grad_guard();
    let v = *logits.size().last().expect("logits [M, T, V]");
    let flat = logits.f_reshape([-1, v])?;
    let labels = batch.labels.f_reshape([-1])?;
    let mut sum = Tensor::f_zeros([], (Kind::Float, logits.device()))?;
    for (start, len) in chunk_ranges(flat.size()[0], rows) {
        let chunk = rows_loss_sum(
            &flat.f_narrow(0, start, len)?,
            &labels.f_narrow(0, start, len)?,
        )?;
        sum = sum.f_add(&chunk)?;
    }
    Ok(sum)
}

/// `(start, length)` of each chunk of at most `rows` (at least 1) of `tokens` rows, in order;
/// the last may be shorter.
pub fn chunk_ranges(tokens: i64, rows: usize) -> impl Iterator<Item = (i64, i64)> {
    let rows = rows.max(1) as i64;
    (0..tokens)
        .step_by(rows as usize)
        .map(move |start| (start, rows.min(tokens - start)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunked_sum_is_the_whole_sum() {
        tch::manual_seed(3);
        let logits = Tensor::randn([3, 7, 11], (Kind::Float, tch::Device::Cpu));
        let labels = Tensor::randint(11, [3, 7], (Kind::Int64, tch::Device::Cpu));
        let _ = labels.narrow(1, 0, 2).fill_(IGNORE_INDEX);
        let batch = Batch {
            input_ids: Tensor::zeros([3, 7], (Kind::Int64, tch::Device::Cpu)),
            positions: None,
            layout: None,
            num_loss_tokens: 15,
            labels,
            pairs: false,
            reference_logps: None,
        };
        let whole = next_token_loss_sum(&logits, &batch).double_value(&[]);
        for rows in [1, 4, 5, 21, 100] {
            let chunked = next_token_loss_sum_chunked(&logits, &batch, rows)
                .unwrap()
                .double_value(&[]);
            assert!(
                (chunked - whole).abs() <= 1e-5 * whole.abs(),
                "{rows}: {chunked} vs {whole}"
            );
        }
        assert!(whole > 0.0);
    }
}
